"""batch.json's figures computed from the batch's own counts."""
from harness.pipeline.run_folder import Summary


def test_the_busy_share_counts_a_worker_that_joined_the_batch():
    # one worker when the batch started, a second joined later (Dask): both evaluated for most of the 10 s
    summary = Summary(wall_s=10.0, gpus=["host-gpu0"], per_worker_s={"host-gpu0": 9.0, "host-gpu1": 6.0}, gpu_s=15.0)
    assert summary.busy_share() == 0.75


def test_the_busy_share_of_workers_that_never_evaluated_is_zero_and_of_no_wall_is_unknown():
    assert Summary(wall_s=10.0, gpus=["gpu0", "gpu1"], gpu_s=0.0).busy_share() == 0.0
    assert Summary(wall_s=0.0, gpus=["gpu0"]).busy_share() is None
    assert Summary(wall_s=5.0).busy_share() is None
