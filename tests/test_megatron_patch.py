"""``megatron-energy patch``: exact-context apply/revert, already-applied detection, version pinning."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from megatron_harness import spawn_world

from megatron_energy.commands import patch as patch_command
from megatron_energy.megatron import patching

SCHEDULES = Path("megatron/core/pipeline_parallel/schedules.py")


def _patch(action: str, root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    patch_command.register(parser.add_subparsers())
    args = parser.parse_args(["patch", action, "--megatron-root", str(root)])
    code = args.func(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_check_passes_on_the_unpatched_release_and_apply_revert_round_trip(
    megatron_files_copy: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = megatron_files_copy()
    pristine = (root / SCHEDULES).read_text()
    code, out, _ = _patch("check", root, capsys)
    assert code == 0 and "applies cleanly to megatron-core 0.19.2" in out

    assert _patch("apply", root, capsys)[0] == 0
    assert "_call_instruction_hook" in (root / SCHEDULES).read_text()
    code, out, _ = _patch("check", root, capsys)
    assert code == 0 and "already applied" in out
    assert _patch("apply", root, capsys)[0] == 0, "applying twice is a no-op"

    assert _patch("revert", root, capsys)[0] == 0
    assert (root / SCHEDULES).read_text() == pristine


@pytest.mark.slow
def test_check_reports_the_full_patched_tree_as_already_applied(
    patched_megatron_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _patch("check", patched_megatron_root, capsys)
    assert code == 0 and "patch set already applied" in out
    assert out.count(": applied") == len(list(patching.patch_set_dir().glob("*.patch")))


def test_another_megatron_version_is_refused_naming_both_versions(
    megatron_files_copy: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = megatron_files_copy()
    info = root / patching.PACKAGE_INFO
    info.write_text(info.read_text().replace("MINOR = 19", "MINOR = 18"))
    code, _, err = _patch("check", root, capsys)
    assert code == 1
    assert "version 0.18.2" in err and "patch set is for 0.19.x" in err


@pytest.mark.slow
def test_a_modified_tree_is_refused_and_left_untouched(
    megatron_files_copy: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = megatron_files_copy()
    schedules = root / SCHEDULES
    edited = schedules.read_text().replace(
        "config.timers('forward-compute', log_level=2).start()", "config.timers('forward-compute').start()"
    )
    schedules.write_text(edited)
    training_before = (root / "megatron/training/training.py").read_text()
    code, out, _ = _patch("check", root, capsys)
    assert code == 1 and "0001-" in out and "conflict" in out
    code, _, err = _patch("apply", root, capsys)
    assert code == 1 and "neither applies nor reverts cleanly" in err
    assert schedules.read_text() == edited
    assert (root / "megatron/training/training.py").read_text() == training_before, "all patches or none"


def test_a_folder_without_megatron_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _patch("check", tmp_path, capsys)
    assert code == 1 and "the folder that contains megatron/" in err


@pytest.mark.slow
def test_apply_patches_a_tree_that_sits_inside_another_git_repository(
    megatron_files_copy: Callable[[], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # plain `git apply` inside a repository skips paths outside the current folder and still succeeds
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    root = megatron_files_copy()
    assert _patch("apply", root, capsys)[0] == 0
    assert "_call_p2p_hook" in (root / "megatron/core/pipeline_parallel/p2p_communication.py").read_text()


def parse_megatron_args(_rank: int, _world_size: int, argv: list[str]) -> tuple[str, bool, str | None]:
    """A world's worker: Megatron's own ``parse_args`` on ``argv``; where it comes from and what it parsed."""
    from megatron.training import arguments

    sys.argv = ["pretrain_gpt.py", *argv]
    args = arguments.parse_args()
    return arguments.__file__, args.energy_optimise, args.energy_trace


@pytest.mark.world
def test_patched_megatron_parses_the_energy_flags_as_its_own(
    patched_megatron_root: Path, tmp_path: Path
) -> None:
    argv = ["--energy-optimise", "--energy-trace", "t.jsonl"]
    ((source, optimise, trace),) = spawn_world(parse_megatron_args, 1, tmp_path, argv, patched_megatron_root)
    assert Path(source).is_relative_to(patched_megatron_root)
    assert (optimise, trace) == (True, "t.jsonl")


@pytest.mark.slow
def test_a_conflicting_edit_with_nothing_applied_says_so_names_the_file_and_does_not_suggest_revert(
    megatron_files_copy: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = megatron_files_copy()
    schedules = root / SCHEDULES
    schedules.write_text(
        schedules.read_text().replace(
            "config.timers('forward-compute', log_level=2).start()",
            "config.timers('forward-compute').start()",
        )
    )
    code, out, err = _patch("check", root, capsys)
    assert code == 1
    assert "nothing applied" in out and "partly" not in out
    assert str(SCHEDULES) in out and str(SCHEDULES) in err
    assert "patch revert" not in err
    code, _, err = _patch("apply", root, capsys)
    assert code == 1 and "nothing was changed" in err and str(SCHEDULES) in err and "patch revert" not in err


@pytest.mark.slow
def test_a_partly_applied_set_is_called_so_and_revert_takes_it_out(
    megatron_files_copy: Callable[[], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = megatron_files_copy()
    pristine = (root / SCHEDULES).read_text()
    first = sorted(patching.patch_set_dir().glob("*.patch"))[0]
    assert patching._git_apply(root, [first]).returncode == 0
    code, out, err = _patch("check", root, capsys)
    assert code == 1 and "partly applied" in out and "patch revert" in err
    assert _patch("revert", root, capsys)[0] == 0
    assert (root / SCHEDULES).read_text() == pristine
