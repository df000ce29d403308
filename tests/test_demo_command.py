"""`megatron-energy demo`, the README's main job without GPUs, through the command line."""

from megatron_energy.cli import main


def test_demo_command_runs_the_loop_and_writes_its_report(tmp_path, capsys):
    status = main(
        [
            "demo",
            "--stages", "4",
            "--microbatches", "4",
            "--freq-grid", "1980,1530,1005",
            "--profile-iters", "1",
            "--run-steps", "3",
            "--energy-dir", str(tmp_path),
        ]
    )  # fmt: skip
    assert status == 0
    out = capsys.readouterr().out
    assert "stock clocks" in out and "(modelled)" in out
    assert "energy per iteration, all GPUs" in out
    job = next(path for path in tmp_path.iterdir() if path.is_dir() and (path / "plan.json").exists())
    assert (job / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (job / "timeline.json").stat().st_size > 0
