"""The shared step-time measure (tfcluster/steptime.py)."""

from tfcluster.steptime import StepClock


def feed(clock, *events):
    for event in events:
        clock.observe(event)


def test_median_ignores_a_slow_interval_and_counts_steps_across_epochs():
    clock = StepClock()
    feed(clock,
         {"event": "first_step", "time": 100.0, "epoch": 1, "step": 1, "steps": 20},
         {"event": "step", "time": 101.0, "epoch": 1, "step": 11, "steps": 20},  # 0.1 s/step
         {"event": "step", "time": 105.0, "epoch": 1, "step": 21, "steps": 20},  # 0.4: a backup
         {"event": "epoch_end", "time": 105.1, "epoch": 1},
         {"event": "step", "time": 106.0, "epoch": 2, "step": 10, "steps": 20})   # 9 steps, 0.111
    assert abs(clock.median_step_seconds - 1 / 9) < 1e-9
    assert clock.last_progress_at == 106.0


def test_no_interval_spans_a_restart_and_none_before_two_events():
    clock = StepClock()
    feed(clock, {"event": "first_step", "time": 10.0, "epoch": 1, "step": 1, "steps": 100})
    assert clock.median_step_seconds is None
    feed(clock,
         {"event": "step", "time": 12.0, "epoch": 1, "step": 21, "steps": 100},   # 0.1 s/step
         {"event": "first_step", "time": 500.0, "epoch": 1, "step": 11, "steps": 100},
         {"event": "step", "time": 501.0, "epoch": 1, "step": 21, "steps": 100})  # 0.1 s/step
    assert clock.intervals == [0.1, 0.1]


def test_a_scripts_progress_calls_are_global_steps_and_a_step_back_is_a_restart():
    clock = StepClock()
    feed(clock,
         {"event": "progress", "time": 0.0, "step": 1},
         {"event": "progress", "time": 0.5, "step": 2},
         {"event": "progress", "time": 1.5, "step": 4},
         {"event": "progress", "time": 90.0, "step": 3},   # Restarted from a backup: no interval.
         {"event": "progress", "time": 90.5, "step": 4})
    assert clock.intervals == [0.5, 0.5, 0.5] and clock.median_step_seconds == 0.5


def test_median_per_epoch_takes_the_intervals_that_end_in_it():
    clock = StepClock()
    feed(clock,
         {"event": "first_step", "time": 0.0, "epoch": 1, "step": 1, "steps": 20},
         {"event": "step", "time": 1.0, "epoch": 1, "step": 6, "steps": 20},    # 0.2 s/step
         {"event": "step", "time": 2.0, "epoch": 1, "step": 11, "steps": 20},   # 0.2
         {"event": "step", "time": 3.8, "epoch": 1, "step": 20, "steps": 20},   # 0.2
         {"event": "step", "time": 7.8, "epoch": 2, "step": 5, "steps": 20},    # 0.8: validation in it
         {"event": "step", "time": 8.3, "epoch": 2, "step": 10, "steps": 20},   # 0.1
         {"event": "step", "time": 8.8, "epoch": 2, "step": 15, "steps": 20})   # 0.1
    assert abs(clock.epoch_median_step_seconds(1) - 0.2) < 1e-9
    assert abs(clock.epoch_median_step_seconds(2) - 0.1) < 1e-9
    assert clock.epoch_median_step_seconds(3) is None
