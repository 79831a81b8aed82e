"""CPU accounting (tritonstack.serve.process_tree): a process that exits mid-measure keeps
its CPU seconds in the server tree's sum and in its roles', and the in-process reference
is not charged for threads that are not its own. Real processes, no server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tritonstack.benchmark.cost import serving_cost
from tritonstack.measure.measured_models import CLASSIFIER, DALI_PREPROCESS
from tritonstack.serve import process_tree

# A "server" that, when told, starts a "stub" burning 0.3 s of CPU, waits for it to exit
# (reaps it) or leaves it a zombie, prints the stub's CPU seconds and idles until told to stop.
SERVER = """
import os, resource, subprocess, sys, time
burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"
sys.stdin.readline()
stub = subprocess.Popen([sys.executable, "-c", burn])
if sys.argv[1] == "reap":
    stub.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(usage.ru_utime + usage.ru_stime, flush=True)
else:
    while open(f"/proc/{stub.pid}/stat").read().split(") ")[1][0] != "Z":
        time.sleep(0.05)
    fields = open(f"/proc/{stub.pid}/stat").read().split(") ")[1].split()
    print((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("ending", ["reap", "zombie"])
def test_a_process_that_exits_mid_measure_keeps_its_cpu_in_the_trees_sum(ending):
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, ending], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        before = process_tree.tree_cpu_seconds(server.pid)
        server.stdin.write("start\n")
        server.stdin.flush()
        stub_s = float(server.stdout.readline())  # the stub has exited
        after = process_tree.tree_cpu_seconds(server.pid)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    assert stub_s >= 0.25
    assert after - before >= stub_s - process_tree.CPU_TICK_S  # the stub's seconds, not lost with it


def test_roles_keep_what_they_spent_and_the_rest_holds_what_exited():
    before = {"tritonserver": 10.0, DALI_PREPROCESS: 20.0, "stub_that_exits": 5.0}
    after = {"tritonserver": 11.0, DALI_PREPROCESS: 23.0, CLASSIFIER: 2.0}  # a stub gone, one started
    # The tree spent 7.5 s: 1 + 3 + 2 by the roles still there, 1.5 by the stub that exited.
    spans = process_tree.cpu_by_role_between(before, after, tree_s=7.5)
    assert spans == pytest.approx({"tritonserver": 1.0, DALI_PREPROCESS: 3.0, CLASSIFIER: 2.0, process_tree.REST: 1.5})
    # Readings a tick apart leave no rest.
    assert process_tree.REST not in process_tree.cpu_by_role_between(before, after, tree_s=6.01)


def test_the_whole_served_cost_counts_the_rest():
    served = {"tritonserver": 1.0, DALI_PREPROCESS: 3.0, CLASSIFIER: 10.0, process_tree.REST: 0.5}
    cost = serving_cost([served], {"dali": [2.0], "fp32": [9.0]})
    assert cost.served_vs_floor.value == pytest.approx(14.5 / 11.0, abs=1e-3)


def test_the_in_process_reference_is_not_charged_for_threads_not_its_own():
    # 10 s of process CPU in the window; the supervisor's thread (7) spent 2 s of it; a
    # restarter's (8) exited in it, unread since: its last moments stay charged.
    before = {1: 3.0, 7: 40.0, 8: 1.0}
    after = {1: 8.0, 7: 42.0, 9: 3.0}
    assert process_tree.cpu_seconds_without(10.0, before, after, excluded={7, 8}) == pytest.approx(8.0)
    assert process_tree.cpu_seconds_without(10.0, before, after, excluded=set()) == pytest.approx(10.0)
    # A thread excluded but gone before the window started (6) spent nothing in it.
    assert process_tree.cpu_seconds_without(10.0, before, after, excluded={6, 7}) == pytest.approx(8.0)
