"""The build cache: keyed by source and target, only the child's own files taken, verdicts kept like libraries.

No compiler runs here: the "libraries" are a few bytes, and `build` is asked for what the cache holds, or for a module
that ends before it compiles anything."""
import os

import pytest

from harness.build.builder import (
    LOG_FILE,
    Build,
    Target,
    _read_entry,
    _store,
    _store_failure,
    build,
    cache_key,
    install,
)
from harness.shared.config import load_config
from harness.shared.messages import Product
from harness.shared.record import Status

H100, A100 = Target("cuda", "9.0", "NVIDIA H100"), Target("cuda", "8.0", "NVIDIA A100")
SOURCE = "class ModelNew: ...\n"


def test_the_cache_key_follows_the_source_and_the_target():
    assert cache_key(SOURCE, H100) == cache_key(SOURCE, Target("cuda", "9.0", "another name, same arch"))
    assert len({cache_key(SOURCE, H100), cache_key(SOURCE + " ", H100), cache_key(SOURCE, A100),
                cache_key(SOURCE, Target("cpu"))}) == 4
    # the light torch/extension.h builds a CUDA source differently; a CPU build never uses it
    assert cache_key(SOURCE, H100, light=True) != cache_key(SOURCE, H100)
    assert cache_key(SOURCE, Target("cpu"), light=True) == cache_key(SOURCE, Target("cpu"))


@pytest.fixture
def built(tmp_path):
    """A build child's folder holding one library, and a library outside it (reached directly and by a link)."""
    workdir, outside = tmp_path / "build-x", tmp_path / "elsewhere"
    (workdir / "torch_extensions" / "ext").mkdir(parents=True)
    outside.mkdir()
    library = workdir / "torch_extensions" / "ext" / "ext.so"
    library.write_bytes(b"\x7fELF ext")
    (outside / "evil.so").write_bytes(b"\x7fELF evil")
    os.symlink(outside / "evil.so", workdir / "link.so")
    return workdir, library, outside / "evil.so"


def test_only_regular_files_inside_the_build_folder_are_stored(built, tmp_path):
    workdir, library, evil = built
    products = {"k1": Product("ext", str(library)), "k2": Product("evil", str(evil)),
                "k3": Product("linked", str(workdir / "link.so")), "k4": Product("gone", str(workdir / "no.so"))}
    entry = tmp_path / "cache" / "key"
    assert _store(products, workdir, entry, compile_s=12.5) == {"k1": {"module": "ext"}}
    assert sorted(p.name for p in entry.iterdir()) == ["k1", "manifest.json"]
    assert (entry / "k1" / "ext.so").read_bytes() == b"\x7fELF ext"
    assert os.listdir(tmp_path / "cache") == ["key"]   # the staging folder was published, not left behind


def test_nothing_usable_stores_nothing(built, tmp_path):
    workdir, _, evil = built
    assert _store({"k2": Product("evil", str(evil))}, workdir, tmp_path / "cache" / "key", 1.0) is None
    assert _store({}, workdir, tmp_path / "cache" / "key", 1.0) is None
    assert os.listdir(tmp_path / "cache") == []


def test_an_entry_reads_back_as_paths_or_as_shipped_bytes_and_installs(built, tmp_path):
    workdir, library, _ = built
    entry = tmp_path / "cache" / "key"
    _store({"k1": Product("ext", str(library))}, workdir, entry, compile_s=12.5)
    manifest, by_path = _read_entry(entry, ship=False)
    assert manifest["compile_s"] == 12.5 and by_path == {"k1": {"module": "ext", "path": str(entry / "k1/ext.so")}}
    _, shipped = _read_entry(entry, ship=True)
    assert shipped == {"k1": {"module": "ext", "data": b"\x7fELF ext"}}
    for libraries, folder in ((by_path, tmp_path / "eval-a"), (shipped, tmp_path / "eval-b")):
        assert install(libraries, folder) == {"k1": {"module": "ext", "dir": str(folder / "k1")}}
        assert (folder / "k1" / "ext.so").read_bytes() == b"\x7fELF ext"
    (entry / "k1" / "ext.so").unlink()
    assert _read_entry(entry, ship=False) is None            # incomplete: built again
    assert _read_entry(tmp_path / "cache" / "absent", ship=False) is None


def test_a_second_identical_entry_leaves_the_first_in_place(built, tmp_path):
    workdir, library, _ = built
    entry = tmp_path / "cache" / "key"
    _store({"k1": Product("ext", str(library))}, workdir, entry, compile_s=1.0)
    library.write_bytes(b"later")
    _store({"k1": Product("ext", str(library))}, workdir, entry, compile_s=2.0)
    assert (entry / "k1" / "ext.so").read_bytes() == b"\x7fELF ext" and os.listdir(tmp_path / "cache") == ["key"]


def test_cached_builds_and_failures_are_returned_without_building(built, tmp_path):
    config, cache = load_config(None, {}), tmp_path / "cache"
    workdir, library, _ = built
    key = cache_key(SOURCE, H100, config.light_cuda_headers)
    _store({"k1": Product("ext", str(library))}, workdir, cache / key, compile_s=3.0, light=True)
    hit = build(SOURCE, config, H100, cache, tmp_path / "logs" / "hit.log")
    assert (hit.outcome, hit.status, hit.compile_s, hit.device_name) == ("cached", None, 3.0, "NVIDIA H100")
    assert hit.libraries == {"k1": {"module": "ext", "path": str(cache / key / "k1/ext.so")}} and hit.light is True

    failed_log = tmp_path / "first.log"
    failed_log.write_text("main.cpp:3:1: error: expected ';'\n")
    key = cache_key("broken", H100, config.light_cuda_headers)
    _store_failure(Build(key, "failed", status=Status.COMPILE_ERROR, error="RuntimeError: expected ';'",
                         compile_s=4.0), cache / key, failed_log)
    assert (cache / key / LOG_FILE).read_text() == failed_log.read_text()
    log_path = tmp_path / "logs" / "again.log"
    again = build("broken", config, H100, cache, log_path)
    assert (again.outcome, again.status, again.error, again.compile_s) == (
        "cached", Status.COMPILE_ERROR, "RuntimeError: expected ';'", 4.0)
    assert again.libraries == {} and log_path.read_text() == failed_log.read_text()


def test_a_builds_folder_is_in_memory_unless_a_folder_is_named_or_memory_is_short(tmp_path, monkeypatch):
    from harness.build import builder

    memory = tmp_path / "shm"
    memory.mkdir()
    monkeypatch.setattr(builder.resources, "MEMORY_TMP", memory)
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv(builder.BUILD_TMP_ENV, raising=False)
    room = {"free": 16 << 30, "available": 16 << 30}
    monkeypatch.setattr(builder.resources, "free_bytes", lambda folder: room["free"])
    monkeypatch.setattr(builder.resources, "available_memory", lambda: room["available"])
    assert builder.build_parent() == str(memory)
    room["free"] = builder.resources.MEMORY_RESERVE_BYTES - 1   # the tmpfs nearly full
    assert builder.build_parent() is None
    room.update(free=16 << 30, available=1 << 30)   # the machine short of memory
    assert builder.build_parent() is None
    room["available"] = None
    assert builder.build_parent() is None
    room["available"] = 16 << 30
    monkeypatch.setenv("TMPDIR", str(tmp_path))   # a temporary folder the user chose
    assert builder.build_parent() is None
    monkeypatch.setenv(builder.BUILD_TMP_ENV, str(tmp_path / "named"))
    assert builder.build_parent() == str(tmp_path / "named")

    # a build is made there and its folder removed after
    monkeypatch.delenv("TMPDIR")
    monkeypatch.delenv(builder.BUILD_TMP_ENV)
    seen = []

    def fake_child(source, key, config, target, cache_dir, log_path, workdir, ship, nice):
        seen.append((workdir, workdir.is_dir()))
        return Build(key, "deferred")

    monkeypatch.setattr(builder, "_build_in_child", fake_child)
    source = "from torch.utils.cpp_extension import load_inline\next = load_inline('x', cpp_sources='')\n" + SOURCE
    done = build(source, load_config(None, {}), Target("cpu"), tmp_path / "cache", tmp_path / "b.log")
    assert done.outcome == "deferred" and len(seen) == 1
    (workdir, existed), = seen
    assert existed and workdir.parent == memory and not workdir.exists()


def test_build_folders_left_by_a_process_that_is_gone_are_removed_by_the_next_build(tmp_path, monkeypatch):
    import subprocess
    import sys

    from harness.build import builder

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()   # a pid no process holds any more
    left, mine, other = tmp_path / f"build-{gone}-abc", tmp_path / f"build-{os.getpid()}-def", tmp_path / "keep-me"
    for folder in (left, mine, other):
        (folder / "obj").mkdir(parents=True)
        (folder / "obj" / "cuda.o").write_bytes(b"\0" * 1024)
    monkeypatch.setattr(builder, "build_parent", lambda: str(tmp_path))
    monkeypatch.setattr(builder.resources, "_SWEPT", set())
    made = builder._build_folder()
    assert not left.exists() and mine.exists() and other.exists()   # only the dead process's
    assert made.parent == tmp_path and made.name.startswith(f"build-{os.getpid()}-")
    (left / "obj").mkdir(parents=True)   # swept once a process and parent: not again at every build
    builder._build_folder()
    assert left.exists()


def test_a_build_child_that_ends_without_a_result_is_deferred_with_the_end_of_its_output(tmp_path):
    # the evaluation runs the module again; the batch's list of deferred builds says how this one ended
    source = ("import os\nfrom torch.utils.cpp_extension import load_inline\n"
              "print('the module gave up before its build', flush=True)\nos._exit(1)\n")
    config = load_config(None, {"build_cache_dir": str(tmp_path / "cache")})
    done = build(source, config, Target("cpu"), tmp_path / "cache", tmp_path / "build.log")
    assert done.outcome == "deferred" and done.status is None
    assert done.error == "build child: exited with code 1 (its output ended: the module gave up before its build)"
