"""The operations behind the invoke tasks, one room per thing a user does.

check: the prerequisites of up. offers: the zones that offer a GPU, priced. cluster: up, status, idle, down. train: a new run (resume: train --resume; attempts: its live loop; maintenance: an attempt ended by host maintenance; stall_report: a stalled attempt on the console;
run_summary: the table it ends with). runs: logs, stop.
tune: a hyperparameter search (tune_loop: its live loop; tune_plans: its processes and trials).
spend: the cost ledger in status, down and the run summary, and costs.
results: data, pull, tensorboard. image: image build. shell: ssh and exec on a worker.
requirements: train --requirements. script_layout: what a script assumes of the layout. script_facts: its
global batch and learning rate, read from its code.
batch_fit: whether the data fills the global batch. common: what they share. Commands may import launch,
backends, state, config, errors, tfconfig, ui and trainer.events; nothing imports commands
but tasks.py. They raise TfClusterError subclasses for anything the user can fix.
"""

from tfcluster.commands.check import check
from tfcluster.commands.cluster import down, idle, status, up
from tfcluster.commands.common import adopt_project_state, run_state
from tfcluster.commands.image import build_image
from tfcluster.commands.offers import offers
from tfcluster.commands.results import data, pull, serve_tensorboard, tensorboard_logdir
from tfcluster.commands.runs import logs, stop
from tfcluster.commands.shell import open_shell, run_on_workers
from tfcluster.commands.spend import costs
from tfcluster.commands.resume import resume
from tfcluster.commands.train import TrainRequest, ensure_synthetic_data, train
from tfcluster.commands.tune import TuneRequest, tune

__all__ = ["TrainRequest", "TuneRequest", "tune", "adopt_project_state", "build_image", "check", "costs", "data", "down", "ensure_synthetic_data", "idle", "logs", "offers", "open_shell", "run_on_workers", "pull", "resume", "run_state", "serve_tensorboard",
           "status", "stop", "tensorboard_logdir", "train", "up"]
