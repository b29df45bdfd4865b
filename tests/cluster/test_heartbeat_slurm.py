"""On the real localhost cluster: a submitted job's ranks write heartbeats under the Slurm job id, and
``scancel --signal=URG`` (what the watcher sends) reaches the training process through submitit and srun,
leaves its Python stacks in ``stacks/`` and does not stop the training."""
import pytest

from hpc_agent.config.resilience import ResilienceConfig
from hpc_agent.core import rundir
from hpc_agent.core.heartbeat_format import STACK_SIGNAL_NAME
from hpc_agent.diagnosis.hang import judge, main_thread
from tests.slurm_helpers import LONG_RUN, SLURM, cleanup_jobs, submit, wait_for

pytestmark = pytest.mark.slurm


def _training_beat(run_dir, after_step: int = 0):
    beats = rundir.read_heartbeats(run_dir)
    return beats[0] if beats and beats[0].phase == "training" and beats[0].step > after_step else None


def test_a_live_job_beats_and_dumps_its_stacks_on_sigurg(tmp_path):
    root = tmp_path / "runs"
    try:
        run_dir, job_id = submit(root, *LONG_RUN, "train.max_steps=100000", "train.ckpt_every=100000",
                                 "resilience.heartbeat_s=1")
        beat = wait_for(lambda: _training_beat(run_dir, after_step=5), timeout=150, what="a training heartbeat")
        assert (beat.job_id, beat.attempt, beat.rank, beat.world) == (job_id, 0, 0, 1)
        assert beat.host.startswith("node") and beat.interval_s == 1.0
        assert judge(rundir.read_heartbeats(run_dir), beat.written_at, None, ResilienceConfig()) is None

        SLURM.run(["scancel", f"--signal={STACK_SIGNAL_NAME}", job_id])
        text = wait_for(lambda: (lambda t: t if "most recent call first" in t else None)(
            rundir.read_stacks(run_dir).get(0, "")), timeout=20, what="a stack dump")
        assert text.startswith(f"# job {job_id} attempt 0 rank 0 host node")
        frames = main_thread(text)
        assert frames and any("launch/engine.py" in f and " in train" in f for f in frames), text[-3000:]
        # The signal asked for stacks only: the job trains on.
        wait_for(lambda: _training_beat(run_dir, after_step=beat.step + 5), timeout=60, what="steps after the dump")
    finally:
        cleanup_jobs(root)
