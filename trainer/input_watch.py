"""Whether a training step waits for its input: what tells the worker whose data stopped coming
(a gs:// read that hangs with its connection open) from its peers, which wait for it inside the
all-reduce at the same step. Both stop at the same step, so their last progress cannot tell them
apart, and neither can their Python stacks (both are inside the compiled step).

A counter after the input pipeline's last stage counts the batches handed on; a Keras callback
notes when each step begins. A step during which no batch was handed on for ``wait_seconds`` is
reported once as an ``input_wait`` event, which the launcher reads when it names a stalled worker
(tfcluster/stall.py). It is not progress. Each process's first step is not watched: it includes
tracing and compilation, which can take minutes on a GPU.

Held-out batches are watched the same way (``counted`` on the validation split, the callback's
``on_test_batch_begin``): a validation read that hangs stops every worker at the epoch's end, after
its last training step, which is the step the event names. Every evaluation call is watched, the
first too: the first validation read of a run is one that can hang, the test function traces in
far less than ``wait_seconds`` (no gradients), and a wait reported in error names a worker only if
the run then stalls.

A peer blocked in the all-reduce can report one too: its pipeline, a full buffer ahead, hands on
nothing while its step cannot finish. So the event also says how far the pipeline is ahead of the
steps (``ahead``: batches handed on minus steps begun). Every worker takes the same batches per step,
so among workers waiting at one step the starved one is the least ahead: its buffer ran dry.
"""

from __future__ import annotations

import threading
import time

from trainer.events import emit

# Long enough that an ordinary slow fetch (a cold read, a shuffle buffer filling) says nothing,
# short against the stall limit (at least a minute), so the event is there when a stall is named.
WAIT_SECONDS = 20.0


class InputWatch:
    def __init__(self, keras, wait_seconds: float = WAIT_SECONDS, poll_seconds: float = 1.0,
                 steps_per_execution: int = 1, steps_per_epoch: int | None = None):
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds
        self.handed = 0  # Batches the pipeline handed on (the map after its last stage).
        # Batches handed on when the newest step began: a healthy worker hands on another within
        # the step (the step takes it, or a prefetching iterator refills), a starved one does not.
        # Relative, so it holds however many batches a step takes (one per local replica).
        self.handed_at_begin = 0
        self.begun = 0  # Training steps begun in this process (a call of the step function runs up to
        # steps_per_execution of them: the epoch's last call may run fewer).
        self.calls = 0  # Calls of the step function begun (the first one traces and is not watched).
        self.watched = False  # Whether the newest call begun is watched (not a first, tracing one).
        self.began_at = 0.0  # When the newest step began (time.time()).
        self.step = 0  # The newest step's number in its epoch, as reported.
        self.reported = 0  # The newest step reported as waiting (once each).
        self._lock = threading.Lock()
        self._stop = threading.Event()
        watch = self

        class _Begun(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                left = (steps_per_epoch - int(batch)) if steps_per_epoch else steps_per_execution
                with watch._lock:
                    watch.calls += 1
                    watch.begun += max(1, min(steps_per_execution, left))
                    watch.began_at = time.time()
                    watch.handed_at_begin = watch.handed
                    watch.step = int(batch) + 1
                    watch.watched = watch.calls > 1

            def on_test_batch_begin(self, batch, logs=None):  # The step stays the last training one.
                with watch._lock:
                    watch.begun += 1
                    watch.began_at = time.time()
                    watch.handed_at_begin = watch.handed
                    watch.watched = True

        self.callback = _Begun()
        self._thread = threading.Thread(target=self._run, name="tfcluster-input-watch", daemon=True)

    def counted(self, tf, dataset):
        """``dataset`` with each element counted as it is handed on (a py_function that runs when
        training takes the element, after prefetch)."""
        def handed() -> int:
            with self._lock:
                self.handed += 1
            return 0

        def mark(*element):
            token = tf.py_function(handed, [], tf.int64)
            with tf.control_dependencies([token]):
                return tuple(tf.identity(part) for part in element)

        return dataset.map(mark)

    def start(self) -> "InputWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def waiting(self, now: float) -> tuple[int, float, int] | None:
        """(the step, seconds waited, batches handed on minus steps begun) when no batch was handed
        on since the newest step began, wait_seconds ago or more."""
        with self._lock:
            if not self.watched or self.handed > self.handed_at_begin or self.reported == self.begun:
                return None
            waited = now - self.began_at
            if waited < self.wait_seconds:
                return None
            self.reported = self.begun
            return self.step, waited, self.handed - self.begun

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                found = self.waiting(time.time())
                if found:
                    emit("input_wait", step=found[0], waited_seconds=round(found[1], 1), ahead=found[2])
            except Exception:  # noqa: BLE001 - a diagnostic must never end the training
                pass
