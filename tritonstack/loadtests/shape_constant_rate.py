"""Locust shape: open loop at a constant request rate.

    --target-rps 20 --open-loop-users 4 --run-time 30s

Starts `--open-loop-users` users at once and holds them for `--run-time`; each
sends `target_rps / open_loop_users` requests per second on a fixed schedule,
independent of response times (see TritonUser.open_loop in users.py).
Options are declared in load_options.py.
"""

from locust import LoadTestShape


class ConstantRate(LoadTestShape):
    use_common_options = True  # reads --run-time
    open_loop = True  # its users send on a schedule (loadtests/users.py)

    def tick(self):
        options = self.runner.environment.parsed_options
        if options.target_rps <= 0:
            raise ValueError("the constant-rate shape needs --target-rps > 0")
        if options.run_time and self.get_run_time() >= options.run_time:
            return None
        return options.open_loop_users, options.open_loop_users
