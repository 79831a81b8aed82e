"""Turn a Locust run's CSV files into PNG plots and a Markdown summary.

Reads `<prefix>_stats.csv` (totals per request name) and `<prefix>_stats_history.csv`
(one row per second: users, requests/s and the percentiles of the last 10 s).
"""

from __future__ import annotations

import csv
import html
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from tritonstack.loadtests.metrics import ModelBreakdown, markdown_table  # noqa: E402

AGGREGATED = "Aggregated"
PERCENTILES = ("50%", "95%", "99%")
# Above this share of one core, a Locust process limits the load it can offer.
CPU_GUARD = 0.90


@dataclass(frozen=True)
class GeneratorCpu:
    """CPU used by one Locust process over the run, as a share of one core."""

    role: str  # "local", "master" or "worker 1"...
    cpu_seconds: float
    wall_seconds: float

    @property
    def core_share(self) -> float:
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0


@dataclass(frozen=True)
class PlotLabels:
    """What the plots say about the run: a title (model, protocol, shape, date),
    and the open loop's target rate, drawn instead of a flat users line."""

    title: str = "Load test"
    target_rps: float | None = None


@dataclass
class RunSummary:
    title: str
    settings: dict[str, str]
    generator_cpu: list[GeneratorCpu] = field(default_factory=list)
    server: list[ModelBreakdown] = field(default_factory=list)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def history(prefix: Path) -> list[dict[str, float]]:
    """One row per second of the run, numbers only: "seconds" since the run's
    first row, "Requests/s" answered in that second (from the running total:
    Locust's own Requests/s column lags and ramps up from zero for several
    seconds), users and the percentiles of the last 10 s. Seconds before the
    first answer are left out rather than drawn as zeros."""
    by_second: dict[float, dict[str, str]] = {}
    for row in read_rows(Path(f"{prefix}_stats_history.csv")):
        if row["Name"] == AGGREGATED:
            by_second[float(row["Timestamp"])] = row  # Locust may write a second twice: the last counts
    rows, previous = [], None
    for timestamp, row in sorted(by_second.items()):
        count = float(row["Total Request Count"])
        # No percentile yet: N/A, or 0 in Locust's first row of answers.
        if previous is not None and row["50%"] not in ("N/A", "0"):
            rate = (count - previous[1]) / (timestamp - previous[0])
            numbers = {key: float(row[key]) for key in ("User Count", *PERCENTILES)}
            rows.append({**numbers, "Requests/s": rate, "seconds": timestamp - min(by_second)})
        previous = (timestamp, count)
    return rows


def plot_over_time(rows: list[dict[str, float]], path: Path, labels: PlotLabels = PlotLabels()) -> None:
    seconds = [row["seconds"] for row in rows]
    figure, (throughput, latency) = plt.subplots(2, 1, sharex=True, figsize=(9, 6.5))
    figure.suptitle(labels.title)
    lines = throughput.plot(seconds, [row["Requests/s"] for row in rows], label="requests/s answered")
    if labels.target_rps is not None:
        lines += [
            throughput.axhline(
                labels.target_rps, color="black", linestyle="--", label=f"target {labels.target_rps:g} requests/s"
            )
        ]
    else:
        users = throughput.twinx()
        lines += users.step(
            seconds, [row["User Count"] for row in rows], color="grey", where="post", label="users (right axis)"
        )
        users.set_ylabel("users")
        users.set_ylim(bottom=0)
        users.yaxis.set_major_locator(MaxNLocator(integer=True))
    throughput.set_ylabel("requests/s")
    throughput.set_ylim(bottom=0)
    throughput.set_title("throughput, per second", fontsize="medium")
    throughput.legend(handles=lines, loc="lower right")
    for percentile in PERCENTILES:
        latency.plot(seconds, [row[percentile] for row in rows], label=f"p{percentile[:-1]}")
    latency.set_ylabel("latency ms")
    latency.set_ylim(bottom=0)
    latency.set_title("latency percentiles over the last 10 s", fontsize="medium")
    latency.set_xlabel("seconds since the start of the run")
    latency.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def by_users(rows: list[dict[str, float]]) -> dict[int, dict[str, float]]:
    """Median of each figure per user count: one point per step of a ramp."""
    groups: dict[int, list[dict[str, float]]] = {}
    for row in rows:
        groups.setdefault(int(row["User Count"]), []).append(row)
    return {
        users: {key: _median([row[key] for row in group]) for key in ("Requests/s", *PERCENTILES)}
        for users, group in sorted(groups.items())
        if users > 0
    }


def plot_against_users(rows: list[dict[str, float]], path: Path, labels: PlotLabels = PlotLabels()) -> None:
    points = by_users(rows)
    users = list(points)
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(10, 4.5))
    figure.suptitle(labels.title)
    throughput.plot(users, [points[u]["Requests/s"] for u in users], marker="o", label="requests/s answered")
    throughput.set_title("throughput (median per number of users)", fontsize="medium")
    throughput.set_xlabel("users")
    throughput.set_ylabel("requests/s")
    throughput.set_ylim(bottom=0)
    throughput.legend(loc="lower right")
    for percentile in PERCENTILES:
        latency.plot(users, [points[u][percentile] for u in users], marker="o", label=f"p{percentile[:-1]}")
    latency.set_title("latency: median of the 10 s windows per number of users", fontsize="medium")
    latency.set_xlabel("users")
    latency.set_ylabel("latency ms")
    latency.set_ylim(bottom=0)
    latency.legend(loc="best")
    for axis in (throughput, latency):
        axis.set_xticks(users)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


PLOTS_SECTION_ID = "tritonstack-plots"


def add_plots_to_html(page: Path, images: list[str], title: str) -> None:
    """Locust's report.html charts only the run's last few seconds: the per-second
    plots of the whole run go below its own sections (once)."""
    if not page.exists():
        return
    text = page.read_text()
    if PLOTS_SECTION_ID in text:
        return
    figures = "".join(f'<p><img src="{name}" alt="{name}" style="max-width:100%"></p>' for name in images)
    section = (
        f'<section id="{PLOTS_SECTION_ID}" style="font-family:sans-serif;margin:2em 5%">'
        f"<h2>{html.escape(title)}: the whole run, per second</h2>"
        "<p>From Locust's CSV history; summary.md next to this file has the server-side "
        f"breakdown per model.</p>{figures}</section>\n"
    )
    head, tail = text.rsplit("</body>", 1)  # the last one: the bundled script holds that string too
    page.write_text(head + section + "</body>" + tail)


def final_stats(prefix: Path) -> list[dict[str, str]]:
    """Totals per request name once every answer arrived (locustfile writes them at
    quit); Locust's own `_stats.csv` if that file is missing."""
    final = Path(f"{prefix}_final_stats.csv")
    return read_rows(final if final.exists() else Path(f"{prefix}_stats.csv"))


def requests_table(prefix: Path) -> str:
    lines = [
        "| type | name | requests | failures | req/s | p50 ms | p95 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in final_stats(prefix):
        lines.append(
            f"| {row['Type']} | {row['Name']} | {row['Request Count']} | {row['Failure Count']} "
            f"| {float(row['Requests/s']):.1f} | {row['50%']} | {row['95%']} | {row['99%']} |"
        )
    return "\n".join(lines)


# How loadtests/users.py names the outcomes other than an answer in time (--deadline-ms).
OUTCOME_KINDS = ("Refused", "DeadlineExceeded", "AnsweredLate")


def outcome_counts(prefix: Path) -> dict[str, int]:
    """Failures by kind, from Locust's failure table: the outcome kinds apart, every
    other error as `failed`."""
    counts = dict.fromkeys((*OUTCOME_KINDS, "failed"), 0)
    failures = Path(f"{prefix}_failures.csv")
    for row in read_rows(failures) if failures.exists() else []:
        kind = next((k for k in OUTCOME_KINDS if row["Error"].startswith(f"{k}(")), "failed")
        counts[kind] += int(row["Occurrences"])
    return counts


def outcomes_section(prefix: Path) -> str:
    """Answered in time, refused, late and failed apart, and the goodput: what a
    client with a deadline got."""
    total = next((row for row in final_stats(prefix) if row["Name"] == "Aggregated"), None)
    if total is None or not int(total["Request Count"]):
        return "(no request)"
    requests, rate = int(total["Request Count"]), float(total["Requests/s"])
    counts = outcome_counts(prefix)
    in_time = requests - sum(counts.values())
    lines = ["| outcome | requests | share |", "|---|---:|---:|"]
    for kind, count in (("answered in time", in_time), *counts.items()):
        lines.append(f"| {kind} | {count} | {count / requests:.1%} |")
    lines.append(f"\nGoodput: {rate * in_time / requests:.1f} answers in time per second.")
    return "\n".join(lines)


def cpu_section(generator_cpu: list[GeneratorCpu]) -> str:
    lines = ["| process | CPU s | wall s | share of one core |", "|---|---:|---:|---:|"]
    for process in generator_cpu:
        lines.append(
            f"| {process.role} | {process.cpu_seconds:.1f} | {process.wall_seconds:.1f} | {process.core_share:.0%} |"
        )
    saturated = [p.role for p in generator_cpu if p.role != "master" and p.core_share > CPU_GUARD]
    if saturated:
        lines.append(
            f"\n**Warning: the load generator was the bottleneck** ({', '.join(saturated)} above "
            f"{CPU_GUARD:.0%} of a core): the server may have more headroom than measured. "
            "Run distributed (`make loadtest-distributed`) or on another machine."
        )
    else:
        lines.append(f"\nNo Locust worker was above {CPU_GUARD:.0%} of a core: the load generator kept up.")
    return "\n".join(lines)


def write_report(prefix: Path, summary: RunSummary, labels: PlotLabels = PlotLabels()) -> Path:
    """Plots next to the CSV files, and `summary.md`; returns the summary's path.
    An open-loop run (fixed users) gets no plot against users."""
    folder = prefix.parent
    rows = history(prefix)
    plot_over_time(rows, folder / "over_time.png", labels)
    against_users = labels.target_rps is None
    if against_users:
        plot_against_users(rows, folder / "against_users.png", labels)
    add_plots_to_html(
        folder / "report.html", ["over_time.png", *(["against_users.png"] if against_users else [])], labels.title
    )
    settings = "\n".join(f"- {key}: {value}" for key, value in summary.settings.items())
    files = "\n".join(
        [
            f"- `over_time.png`: throughput, {'users' if against_users else 'target rate'} and p50/p95/p99 "
            "latency over time",
            *(["- `against_users.png`: throughput and latency per number of users"] if against_users else []),
            "- `report.html`: Locust's report, these plots added below its own charts; "
            "`locust_*.csv`: Locust's statistics",
        ]
    )
    server = markdown_table(summary.server) if summary.server else "(no metrics endpoint given)"
    text = f"""# {summary.title}

{settings}

## Requests (client side)

{requests_table(prefix)}

## Outcomes

{outcomes_section(prefix)}

## Server side, per model (Triton metrics, after minus before)

{server}

## Load generator CPU

{cpu_section(summary.generator_cpu)}

## Files

{files}
"""
    path = folder / "summary.md"
    path.write_text(text)
    return path


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
