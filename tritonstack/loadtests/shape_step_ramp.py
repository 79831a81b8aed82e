"""Locust shape: a step ramp of users, closed loop.

    --step-users 2 --step-seconds 10 --steps 4   ->  2, 4, 6, 8 users, 10 s each

Each step holds long enough for throughput and latency to settle, so the report
can plot them against the number of users. `--run-time` bounds the ramp too
(loadtests/headless.py fits the steps into it). Options are declared in load_options.py.
"""

from locust import LoadTestShape

from tritonstack.loadtests.load_options import DEFAULT_STEP_S


class StepRamp(LoadTestShape):
    use_common_options = True  # reads --run-time (Locust ignores it for a shape that does not)

    def tick(self):
        options = self.runner.environment.parsed_options
        elapsed = self.get_run_time()
        step = int(elapsed // (options.step_seconds or DEFAULT_STEP_S))
        if step >= options.steps or (options.run_time and elapsed >= options.run_time):
            return None  # ends the run
        users = options.step_users * (step + 1)
        return users, users  # spawn each step's users at once
