"""Scripts for a GPU machine: the GPU variant's pipelines beside the CPU variant's
(`.gpu_check`), both variants served (`.gpu_serve`), and DALI and the server packed
in pieces to carry there (`.gpu_pieces`). Run with `python -m`, not by a command."""
