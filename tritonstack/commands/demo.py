"""`make demo`: start tritonserver on the model repository, classify real photos
over HTTP and over gRPC, print each one's top 5, classify a clip with the video
preset, the boxes of a collage with the regions preset and synthesized speech with
the audio preset when the repository has them, stop the server."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tritonstack import cli
from tritonstack.client.classifier import ClassifierClient
from tritonstack.contract import DEFAULT_AUDIO_MODEL, DEFAULT_MODEL, DEFAULT_REGIONS_MODEL, DEFAULT_VIDEO_MODEL
from tritonstack.repository_files import CONFIG_FILENAME
from tritonstack.samples.photos import PHOTOS, SAMPLE_CLIP, collage, photo_bytes, sample_clip
from tritonstack.serve.launcher import TritonServer


@dataclasses.dataclass(frozen=True)
class DemoOptions(cli.RepositoryOption):
    model: str = cli.option(DEFAULT_MODEL, "--model", help="the image model the photos go to")


def parser() -> argparse.ArgumentParser:
    made = cli.parser(__doc__)
    cli.add_options(made, DemoOptions)
    return made


def run(args: argparse.Namespace) -> int:
    options = cli.from_args(DemoOptions, args)
    print(f"starting tritonserver on {options.model_repository} ...", flush=True)
    with TritonServer(options.model_repository) as server:
        print(f"ready: HTTP {server.http_url}, gRPC {server.grpc_url}\n")
        for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
            with ClassifierClient(url, protocol, options.model) as client:
                print(f"== {options.model} over {protocol.upper()} ==")
                for name in PHOTOS:
                    top = client.classify([photo_bytes(name)], top_k=5)[0]
                    ranked = ", ".join(f"{p.label} ({p.score:.3f})" for p in top)
                    print(f"  {name:<22} {ranked}")
                print()
        if (options.model_repository / DEFAULT_VIDEO_MODEL / CONFIG_FILENAME).exists():
            show_clip(server)
        if (options.model_repository / DEFAULT_REGIONS_MODEL / CONFIG_FILENAME).exists():
            show_collage(server)
        if (options.model_repository / DEFAULT_AUDIO_MODEL / CONFIG_FILENAME).exists():
            show_speech(server)
    print("server stopped")
    return 0


def show_clip(server: TritonServer) -> None:
    """The packaged clip (panning over chelsea) through the video ensemble: its
    frames' mean top 5 and each frame's top 1."""
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        with ClassifierClient(url, protocol, DEFAULT_VIDEO_MODEL) as client:
            (clip,) = client.classify_clips_each([sample_clip()], top_k=5)
            print(f"== {DEFAULT_VIDEO_MODEL} over {protocol.upper()}: {SAMPLE_CLIP.name}, {len(clip.frames)} frames ==")
            print("  mean of the frames  " + ", ".join(f"{p.label} ({p.score:.3f})" for p in clip.top))
            print(
                "  each frame's top 1  "
                + ", ".join(f"{frame[0].label} ({frame[0].score:.2f})" for frame in clip.frames)
            )
            print()


def show_collage(server: TritonServer) -> None:
    """Three photos side by side in one JPEG, a box around each subject, sent once
    through the regions ensemble: each box's top 3, in order."""
    picture = collage()
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        with ClassifierClient(url, protocol, DEFAULT_REGIONS_MODEL) as client:
            answer = client.classify_regions(picture.jpeg, picture.boxes, top_k=3)
        print(f"== {DEFAULT_REGIONS_MODEL} over {protocol.upper()}: a collage of {', '.join(picture.photos)} ==")
        for index, (box, top) in enumerate(zip(picture.boxes, answer)):
            corners = ", ".join(f"{value:.0f}" for value in box)
            print(f"  box {index} [{corners}]  " + ", ".join(f"{p.label} ({p.score:.3f})" for p in top))
        print()


def show_speech(server: TritonServer) -> None:
    """Three synthesized utterances between silence and music (tritonstack.samples.speech),
    as FLAC, through the audio ensemble: its speech segments beside the utterances' own spans."""
    from tritonstack.samples.speech import sample_speech, sample_track

    spoken = ", ".join(f"{start:.2f}-{end:.2f} s" for start, end in sample_track().speech_spans)
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        with ClassifierClient(url, protocol, DEFAULT_AUDIO_MODEL) as client:
            (answer,) = client.classify_audio([sample_speech("flac")])
        print(f"== {DEFAULT_AUDIO_MODEL} over {protocol.upper()}: speech spoken at {spoken} ==")
        print(
            "  segments  "
            + ", ".join(f"{s.start_s:.2f}-{s.end_s:.2f} s ({s.probability:.2f})" for s in answer.segments)
        )
        print()


def main(argv: list[str] | None = None) -> int:
    """The exit code; one-line errors (tritonstack.cli)."""
    return cli.run(run, argv, parser)


if __name__ == "__main__":
    sys.exit(main())
