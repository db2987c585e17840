"""The five seeds in ../shared/seeds (kept out of the repo): none may pass."""
from __future__ import annotations

import pytest
from conftest import SEED_PROBLEM, SEEDS, run_folder

pytestmark = pytest.mark.skipif(not SEEDS.is_dir(), reason=f"seeds not found at {SEEDS}")

EXPECTED_CPU = {"000": "needs_cuda", "001": "needs_cuda", "002": "no_code", "003": "no_code", "004": "no_code"}
EXPECTED_CUDA = {"000": "compile_error", "001": "runtime_error", "002": "no_code", "003": "no_code",
                 "004": "no_code"}


def _statuses(outcome) -> dict[str, str]:
    return {r.sample_id[:3]: r.status.value for r in outcome.records}


def test_seeds_on_cpu(tmp_path):
    outcome = run_folder(SEEDS, tmp_path / "seeds", "cpu", problem=str(SEED_PROBLEM))
    assert _statuses(outcome) == EXPECTED_CPU
    explained = {r.sample_id[:3] for r in outcome.records if r.explanation_path}
    assert "001" in explained  # 001 explains its approach after the code


@pytest.mark.gpu
def test_seeds_on_cuda(tmp_path):
    outcome = run_folder(SEEDS, tmp_path / "seeds", "cuda", problem=str(SEED_PROBLEM))
    assert _statuses(outcome) == EXPECTED_CUDA
    by_seed = {r.sample_id[:3]: r for r in outcome.records}
    assert "illegal memory access" in by_seed["001"].error
    assert by_seed["001"].compiled is True and by_seed["000"].compiled is False
