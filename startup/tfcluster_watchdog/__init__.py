"""tfcluster idle watchdog: stops (or deletes) a machine that nobody uses, so it stops billing.

Runs on the VM (systemd service from startup.sh) or on a bring-your-own host (started by
`invoke up --idle-minutes N`). Standard library only.

Every poll (at most 60 s apart) it reads its settings afresh, so a change from the laptop
(`invoke idle`) applies without recreating anything, runs each probe, and decides:

- busy while any enabled probe sees activity: a tfcluster training process that makes progress
  (see "stalls" below), an interactive
  SSH session (a pts whose parent is sshd), or GPU utilisation above a threshold; and, always,
  while the boot script is still working (its marker file exists), for at most
  ``boot_grace_minutes`` after it started, so a hung install cannot keep a VM billing;
- idle time starts when the machine stops being busy and resets on any activity and after a
  reboot (the kernel's boot id changes);
- after ``idle_minutes`` idle it logs the decision with the probe readings, then acts:
  ``stop`` halts the guest (the instance goes to TERMINATED; disks keep billing), ``delete``
  deletes the VM through the Compute API with the metadata server's token and waits on its
  operation. A refused delete (a missing role, the API off), or one whose operation ends in an
  error, halts the guest instead and says so in its status, so the VM stops billing for its GPU
  either way;
- a training run counts as idle once its last progress is older than the stall limit, so a
  stalled job cannot hold a VM past the limit plus the idle time. Progress is read from the job's
  own log (its stdout, /proc/PID/fd/1): the trainer's step events and ``tfcluster.progress``
  calls (``TFCLUSTER_EVENT`` lines with their time). The limit is the launcher's rule
  (tfcluster/stall.py): max(``stall_minutes`` or 10 min, 20 x the median step time) after the
  first step; before it, or for a script that reports no steps, 30 min (or ``stall_minutes`` if
  larger) since the log was last written. A job whose log cannot be found counts as busy;
- ``idle_minutes = 0`` disables it (the hypervisor deadline, max_run_duration, still applies);
- ``then_stop`` (`train --then stop|down`) halts the machine as soon as that run's end is recorded
  here, laptop or not: its newest attempt's exit file (the launcher's wrapper writes it) reads 0,
  or any code on the last attempt the launcher allows. Once per run: a restarted VM stays up;
- ``budget_end`` (`train --budget`) halts the machine at that Unix time, laptop or not. Once per
  end time, as ``then_stop``.

A failing probe is logged and read as "no activity seen": a broken probe must not keep a
forgotten VM billing forever. Nothing a probe or a settings source does can kill the loop.

The package holds: settings.py (what it is told, and how a bad value is refused), probes.py (what
it reads of the machine: jobs and their progress, SSH sessions, the boot script, GPUs, a run's
end), decision.py (idle time and when to act), gce.py (the metadata server and the Compute API)
and loop.py (the poll loop, its state files and its command line). `python3 <this folder>` runs it
(__main__.py). It may import the standard library only: it runs on the image's python3, before
anything is installed.
"""
