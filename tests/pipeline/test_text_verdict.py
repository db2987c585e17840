"""The verdicts of the text alone, without torch (harness/pipeline/text_verdict.py): the device found without CUDA,
what is left to the judge's path. tests/test_cli_text_verdict.py compares whole submits with the judge's path."""
from __future__ import annotations

import pytest
import torch
from conftest import judge_config, pipeline_settings

from harness import cli
from harness.judge import extraction
from harness.pipeline import engines, text_verdict
from harness.shared.problems import resolve_problem
from harness.shared.record import Status
from harness.submission.submissions import Submission

PROBLEM = resolve_problem("level0/1")
SOURCE = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def _machine(monkeypatch, tmp_path, version_file: dict, driver: bool, gpus: int = 0, wsl: bool = False,
             visible=None):
    """A machine as the probe sees it: torch's version file, the driver's folder, /dev's GPU nodes."""
    monkeypatch.setattr(text_verdict, "installed_torch_build",
                        lambda: (version_file["__version__"], version_file.get("cuda")))
    monkeypatch.setattr(text_verdict, "torch_version_file", lambda: version_file)
    (tmp_path / "driver").mkdir(exist_ok=True)
    monkeypatch.setattr(text_verdict, "NVIDIA_DRIVER", tmp_path / ("driver" if driver else "absent"))
    monkeypatch.setattr(text_verdict, "WSL_GPU", tmp_path / ("driver" if wsl else "absent"))
    monkeypatch.setattr(text_verdict, "_gpu_nodes", lambda: [f"nvidia{i}" for i in range(gpus)])
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


CUDA_BUILD = {"__version__": "2.13.0+cu130", "cuda": "13.0", "hip": None}
CPU_BUILD = {"__version__": "2.13.0+cpu", "cuda": None, "hip": None}


def test_the_device_is_the_given_one_else_found_without_cuda(monkeypatch, tmp_path):
    probe = text_verdict.device_without_torch
    _machine(monkeypatch, tmp_path, CUDA_BUILD, driver=True, gpus=2)
    assert probe(pipeline_settings(device="cpu"))[0] == "cpu"   # given: whatever the machine has
    assert probe(pipeline_settings(device=None))[0] == "cuda"
    _machine(monkeypatch, tmp_path, CPU_BUILD, driver=True, gpus=2)
    assert probe(pipeline_settings(device=None)) == ("cpu", "torch is built without CUDA")
    _machine(monkeypatch, tmp_path, CUDA_BUILD, driver=False)
    assert probe(pipeline_settings(device=None))[0] == "cpu"   # a CUDA wheel on a machine without the driver
    _machine(monkeypatch, tmp_path, CUDA_BUILD, driver=True, gpus=2, visible="")
    assert probe(pipeline_settings(device=None))[0] == "cpu"
    _machine(monkeypatch, tmp_path, CUDA_BUILD, driver=True, gpus=2, visible="1")
    assert probe(pipeline_settings(device=None))[0] == "cuda"
    # only CUDA could tell: the judge's path
    for machine in (dict(version_file={**CUDA_BUILD, "hip": "6.2"}, driver=False),
                    dict(version_file=CUDA_BUILD, driver=False, wsl=True),
                    dict(version_file=CUDA_BUILD, driver=True, gpus=0),
                    dict(version_file=CUDA_BUILD, driver=True, gpus=2, visible="-1")):
        _machine(monkeypatch, tmp_path, **machine)
        assert probe(pipeline_settings(device=None))[0] is None, machine


def test_this_machines_device_and_versions_are_torchs():
    device, _ = text_verdict.device_without_torch(pipeline_settings(device=None))
    assert device == ("cuda" if torch.cuda.is_available() else "cpu")
    extraction.installed_torch_build.cache_clear()
    assert extraction.installed_torch_build() == (torch.__version__, torch.version.cuda)


def test_the_gpus_and_build_jobs_are_the_engines(monkeypatch, tmp_path):
    assert text_verdict.CPU_PER_GPU_WORKER == engines.CPU_PER_GPU_WORKER
    _machine(monkeypatch, tmp_path, CUDA_BUILD, driver=True, gpus=3)
    chosen = pipeline_settings(gpus="2, 5")
    assert text_verdict.visible_gpus(chosen) == engines.visible_gpus(chosen)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert text_verdict.visible_gpus(pipeline_settings()) == engines.visible_gpus(pipeline_settings()) == ["1", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert text_verdict.visible_gpus(pipeline_settings()) == ["0", "1", "2"]


@pytest.mark.parametrize("text, is_python", [(SOURCE, True), (f"```python\n{SOURCE}```\n", False)])
def test_a_source_that_goes_on_to_a_build_is_left_to_the_judge_and_nothing_is_written(tmp_path, text, is_python):
    submission = Submission(label="s.py", text=text, is_python=is_python, problem=PROBLEM)
    assert text_verdict.judge_text(submission, pipeline_settings(device="cpu"), "cpu", tmp_path / "run") is None
    assert not (tmp_path / "run").exists()


def test_cuda_without_a_gpu_to_list_is_left_to_the_judge(monkeypatch, tmp_path):
    _machine(monkeypatch, tmp_path, CUDA_BUILD, driver=True, gpus=0)
    submission = Submission(label="e.py", text="", is_python=True, problem=PROBLEM)
    assert text_verdict.judge_text(submission, pipeline_settings(device="cuda"), "cuda", tmp_path / "run") is None
    record, summary = text_verdict.judge_text(submission, pipeline_settings(device="cpu"), "cpu", tmp_path / "run")
    assert record.status == Status.NO_CODE and summary.gpus == ["cpu"] and summary.statuses == {"no_code": 1}


def test_a_running_server_decides_the_device_of_a_submit_that_names_none(monkeypatch, tmp_path):
    from harness import serve

    monkeypatch.setattr(serve, "answering", lambda results_dir: True)
    submission = Submission(label="e.py", text="", is_python=True, problem=PROBLEM)
    unnamed = cli._parser().parse_args(["submit", "--problem", "level0/1", "--submission", "e.py", "--json"])
    assert cli._decided_by_text(unnamed, judge_config(device=None), submission, tmp_path) is None
    named = cli._parser().parse_args(["submit", "--problem", "level0/1", "--submission", "e.py", "--json",
                                      "--device", "cpu"])
    assert cli._decided_by_text(named, judge_config(device="cpu"), submission, tmp_path) == 0
    monkeypatch.setenv(cli.TEXT_VERDICT_ENV, "off")
    assert cli._decided_by_text(named, judge_config(device="cpu"), submission, tmp_path) is None
