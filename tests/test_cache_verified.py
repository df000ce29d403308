"""``JobCache.store`` / ``load``: atomic, checksummed, fingerprinted; a corrupt folder is moved aside, never
deleted, and the miss says what failed; concurrent jobs never see a partial set."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from job_facts import job_facts as _job
from job_facts import planned as _planned
from job_facts import read_back

from megatron_energy.energy_dir import MANIFEST, QUARANTINE_PREFIX, JobFiles
from megatron_energy.runtime.planning_round.cache import JobCache
from megatron_energy.runtime.planning_round.cache_manifest import has_cached_files, quarantine

PROFILE = "stage,instruction,frequency,time,energy\n0,forward,1980,0.0125,12.5\n0,backward,1980,0.025,25.0\n"
BASELINE = json.dumps({"stock_time_s": 0.5, "stock_energy_j": {"0": 300.0}})


def _artefacts(tag: str = "") -> dict[str, str]:
    return {
        "profile.csv": PROFILE + tag,
        "baseline.json": BASELINE,
        "plan.json": json.dumps({"target": "iso-time", "tag": tag}),
        "frontier.csv": "time_s,energy_j\n1.0,100.0\n",
    }


def test_store_then_load_returns_the_verified_artefacts(tmp_path: Path) -> None:
    JobCache(tmp_path, _job()).store(_artefacts())
    loaded = JobCache(tmp_path, _job()).load()
    assert loaded.hit and loaded.quarantined is None
    assert "cache hit" in loaded.message
    assert loaded.artefacts["profile.csv"].decode() == PROFILE
    record = json.loads(loaded.artefacts["job.json"])
    assert record["parts"] == read_back(_job()), "job.json is added to the set"
    manifest = json.loads((loaded.folder / MANIFEST).read_text())
    assert set(manifest["artefacts"]) == {*_artefacts(), "job.json"}
    assert manifest["fingerprint"] == JobCache(tmp_path, _job()).full_fingerprint
    assert json.loads((tmp_path / "last_job.json").read_text())["parts"] == read_back(_job())


def test_a_miss_says_first_run_or_what_changed(tmp_path: Path) -> None:
    first = JobCache(tmp_path, _job()).load()
    assert not first.hit and "empty" in first.message
    JobCache(tmp_path, _job()).store(_artefacts())
    changed = JobCache(tmp_path, _job(num_microbatches=4)).load()
    assert not changed.hit and changed.quarantined is None
    assert "num_microbatches: 8 -> 4" in changed.message and "pipeline_size" not in changed.message


def _scale_energies(folder: Path) -> None:
    """The issue's case: the profile's energies scaled by 0.01 after it was written."""
    lines = (folder / "profile.csv").read_text().splitlines()
    scaled = [lines[0]] + [
        ",".join([*row.split(",")[:4], f"{float(row.split(',')[4]) * 0.01:g}"]) for row in lines[1:]
    ]
    (folder / "profile.csv").write_text("\n".join(scaled) + "\n")


def _corrupt_baseline(folder: Path) -> None:
    (folder / "baseline.json").write_text('{"stock_time_s": 0.5, "stock_energ')


def _truncate_profile(folder: Path) -> None:
    path = folder / "profile.csv"
    path.write_bytes(path.read_bytes()[:20])


def _same_size_edit(folder: Path) -> None:
    path = folder / "plan.json"
    path.write_text(path.read_text().replace("iso-time", "iso-tame"))


def _foreign_manifest(folder: Path) -> None:
    other = JobCache(folder.parent, _job(pipeline_size=2))
    other.store(_artefacts())
    (folder / MANIFEST).write_bytes((other.folder / MANIFEST).read_bytes())


def _edit_manifest_entry(folder: Path, **entry: object) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["artefacts"]["plan.json"].update(entry)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "energies scaled by 0.01": (_scale_energies, "profile.csv has"),
    "corrupt baseline.json": (_corrupt_baseline, "baseline.json has"),
    "truncated profile": (_truncate_profile, "profile.csv has 20 bytes"),
    "same-size edit": (_same_size_edit, "plan.json does not match its checksum"),
    "missing artefact": (lambda folder: (folder / "frontier.csv").unlink(), "frontier.csv is missing"),
    "missing manifest": (lambda folder: (folder / MANIFEST).unlink(), "manifest.json is missing"),
    "unparsable manifest": (lambda folder: (folder / MANIFEST).write_text("{"), "not valid JSON"),
    "foreign fingerprint": (_foreign_manifest, "belongs to another job"),
    "checksum not hex": (
        lambda folder: _edit_manifest_entry(folder, sha256="not-a-digest"),
        "manifest.json has malformed artefact entries (artefacts.plan.json.sha256: String should match",
    ),
    "size as text": (
        lambda folder: _edit_manifest_entry(folder, size_bytes="41"),
        "(artefacts.plan.json.size_bytes: Input should be a valid integer)",
    ),
    "unknown entry key": (
        lambda folder: _edit_manifest_entry(folder, mtime=0),
        "(artefacts.plan.json.mtime: Extra inputs are not permitted)",
    ),
}


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_folder_failing_verification_is_moved_aside_whole_and_the_job_reprofiles(
    tmp_path: Path, kind: str
) -> None:
    corrupt, failure = CORRUPTIONS[kind]
    cache = JobCache(tmp_path, _job())
    cache.store(_artefacts())
    corrupt(cache.folder)
    before = {
        path.name: path.read_bytes() for path in cache.folder.iterdir() if not path.name.startswith(".")
    }

    loaded = JobCache(tmp_path, _job()).load()

    assert not loaded.hit and loaded.quarantined is not None
    assert failure in loaded.message
    assert str(loaded.quarantined) in loaded.message and "profiling again" in loaded.message
    assert loaded.quarantined.parent == cache.folder and loaded.quarantined.name.startswith(QUARANTINE_PREFIX)
    kept = {path.name: path.read_bytes() for path in loaded.quarantined.iterdir()}
    assert kept == before, "every file moved aside unchanged, none deleted"
    assert [path.name for path in cache.folder.iterdir() if not path.name.startswith(".")] == [
        loaded.quarantined.name
    ]
    cache.store(_artefacts())
    assert JobCache(tmp_path, _job()).load().hit, "the re-profiled set is used next time"
    assert loaded.quarantined.is_dir(), "the quarantine stays"


def test_a_corrupt_plan_alone_is_moved_aside_and_rebuilt_from_the_verified_profile(tmp_path: Path) -> None:
    """Issue 44: a corrupt plan.json took the verified profile into quarantine; the job re-profiled."""
    cache = JobCache(tmp_path, _planned("iso-time"))
    cache.store(_artefacts("first"))
    _same_size_edit(cache.folder)
    damaged = (cache.folder / "plan.json").read_bytes()
    seen: list[str] = []

    def replan(artefacts: Mapping[str, bytes], fingerprint: str) -> dict[str, str]:
        seen.append(artefacts["profile.csv"].decode())
        return _artefacts("first") | {"plan.json": json.dumps({"target": "iso-time", "tag": "rebuilt"})}

    loaded = JobCache(tmp_path, _planned("iso-time"), replan=replan).load()

    assert loaded.hit and seen == [PROFILE + "first"], "planned from the folder's own verified profile"
    assert json.loads(loaded.artefacts["plan.json"])["tag"] == "rebuilt"
    assert loaded.quarantined is not None and loaded.quarantined.parent == cache.folder
    assert [path.name for path in loaded.quarantined.iterdir()] == ["plan.json"]
    assert (loaded.quarantined / "plan.json").read_bytes() == damaged, "the corrupt plan is kept"
    assert "\n" not in loaded.message and "; profiling again" not in loaded.message
    assert (
        "plan.json does not match its checksum" in loaded.message
        and str(loaded.quarantined) in loaded.message
    )
    assert loaded.message.endswith("rebuilt the plan from the verified profile, without profiling again")
    assert JobCache(tmp_path, _planned("iso-time")).load().hit, "the rebuilt set verifies next time"


def test_a_corrupt_profile_still_moves_the_folder_aside_whole_with_a_replan(tmp_path: Path) -> None:
    cache = JobCache(tmp_path, _planned("iso-time"))
    cache.store(_artefacts())
    _truncate_profile(cache.folder)

    def replan(artefacts: Mapping[str, bytes], fingerprint: str) -> dict[str, str]:
        raise AssertionError("a corrupt profile is not planned from")

    loaded = JobCache(tmp_path, _planned("iso-time"), replan=replan).load()
    assert not loaded.hit and loaded.quarantined is not None and "profiling again" in loaded.message
    assert {path.name for path in loaded.quarantined.iterdir()} >= {"profile.csv", "plan.json", MANIFEST}


def test_set_aside_moves_a_verified_but_unusable_folder_whole_and_keeps_it(tmp_path: Path) -> None:
    cache = JobCache(tmp_path, _job())
    assert cache.set_aside() is None, "nothing cached: nothing to move"
    cache.store(_artefacts())
    before = {path.name: path.read_bytes() for path in cache.folder.iterdir() if path.is_file()}
    before.pop(".lock")

    aside = cache.set_aside()

    assert aside is not None and aside.parent == cache.folder and aside.name.startswith(QUARANTINE_PREFIX)
    assert {path.name: path.read_bytes() for path in aside.iterdir()} == before
    assert not JobCache(tmp_path, _job()).load().hit
    cache.store(_artefacts("again"))
    assert JobCache(tmp_path, _job()).load().hit and aside.is_dir(), "a new store leaves the old set aside"


def test_an_artefact_stored_as_invalid_json_fails_verification(tmp_path: Path) -> None:
    JobCache(tmp_path, _job()).store(_artefacts() | {"baseline.json": "{not json"})
    loaded = JobCache(tmp_path, _job()).load()
    assert not loaded.hit and "baseline.json is not valid JSON" in loaded.message


def test_a_set_without_a_required_artefact_is_not_a_hit(tmp_path: Path) -> None:
    JobCache(tmp_path, _job()).store({"profile.csv": "stage\n"})
    loaded = JobCache(tmp_path, _job()).load()
    assert not loaded.hit and "lists no plan.json, baseline.json" in loaded.message


@pytest.mark.parametrize("name", ["../escape.csv", "sub/profile.csv", ".hidden", MANIFEST])
def test_store_refuses_names_that_are_not_plain_artefact_files(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not plain file names"):
        JobCache(tmp_path, _job()).store({name: "x"})


def _store_and_load(root: str, worker: int, rounds: int) -> None:
    """Store sets tagged with this worker and check every hit is one consistent set; exit 1 otherwise."""
    for round_ in range(rounds):
        cache = JobCache(Path(root), _job())
        tag = f"# worker {worker} round {round_}\n"
        cache.store(_artefacts(tag))
        loaded = cache.load()
        if not loaded.hit:
            raise SystemExit(f"miss: {loaded.message}")
        profile_tag = loaded.artefacts["profile.csv"].decode().removeprefix(PROFILE)
        plan_tag = json.loads(loaded.artefacts["plan.json"])["tag"]
        if profile_tag != plan_tag:
            raise SystemExit(f"mixed set: profile {profile_tag!r}, plan {plan_tag!r}")


@pytest.mark.slow
def test_concurrent_jobs_sharing_an_energy_dir_never_see_a_partial_set(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_store_and_load, args=(str(tmp_path), n, 25)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [worker.exitcode for worker in workers] == [0] * 4
    folder = JobCache(tmp_path, _job()).folder
    assert not [path for path in folder.iterdir() if path.name.startswith(QUARANTINE_PREFIX)]


def test_a_changed_planning_input_re_plans_from_the_verified_run_and_names_the_input(tmp_path: Path) -> None:
    JobCache(tmp_path, _planned("iso-time")).store(_artefacts("first"))
    JobCache(tmp_path, _planned("iso-time", num_microbatches=4)).store(_artefacts("other job"))
    seen: list[tuple[str, str]] = []

    def replan(artefacts: Mapping[str, bytes], fingerprint: str) -> dict[str, str]:
        seen.append((artefacts["profile.csv"].decode(), fingerprint))
        return _artefacts("re-planned")

    cache = JobCache(tmp_path, _planned("power:400"), replan=replan)
    loaded = cache.load()
    assert seen == [(PROFILE + "first", cache.fingerprint)], "planned from the same job's verified profile"
    assert loaded.hit and "energy cache hit" not in loaded.message
    assert "planning.target: 'iso-time' -> 'power:400'" in loaded.message
    assert "without profiling again" in loaded.message and "num_microbatches" not in loaded.message
    assert json.loads(loaded.artefacts["plan.json"])["tag"] == "re-planned"
    assert JobCache(tmp_path, _planned("power:400")).load().hit, "stored under its own key"
    assert not JobCache(tmp_path, _planned("min-energy")).load().hit, "without a replan, a miss"


def test_a_profile_kept_without_a_plan_is_re_planned_for_another_target_and_for_its_own(
    tmp_path: Path,
) -> None:
    """Issue 33, item 5: a run whose power budget was out of reach keeps its profile (no plan.json)."""
    kept = {
        name: text for name, text in _artefacts("kept").items() if name in ("profile.csv", "baseline.json")
    }
    out_of_reach = JobCache(tmp_path, _planned("power:300"))
    out_of_reach.store(kept)
    seen: list[str] = []

    def replan(artefacts: Mapping[str, bytes], fingerprint: str) -> dict[str, str]:
        seen.append(fingerprint)
        return _artefacts("re-planned")

    retry = JobCache(tmp_path, _planned("power:520"), replan=replan).load()
    assert retry.hit and json.loads(retry.artefacts["plan.json"])["tag"] == "re-planned"
    assert "planning.target: 'power:300' -> 'power:520'" in retry.message
    again = JobCache(tmp_path, _planned("power:300"), replan=replan).load()  # the same budget once more
    assert again.hit and f"planned from the profile cached in {out_of_reach.folder}" in again.message
    assert seen == [JobCache(tmp_path, _planned("power:520")).fingerprint, out_of_reach.fingerprint]
    assert not list(tmp_path.glob("*/quarantine-*")), "a kept profile is never set aside"


def test_a_re_plan_that_fails_is_a_miss_that_says_why(tmp_path: Path) -> None:
    JobCache(tmp_path, _planned("iso-time")).store(_artefacts())

    def replan(artefacts: Mapping[str, bytes], fingerprint: str) -> dict[str, str]:
        raise ValueError("it holds no measured.json")

    loaded = JobCache(tmp_path, _planned("slowdown:0.05"), replan=replan).load()
    assert not loaded.hit
    assert "cannot re-plan from its profile (it holds no measured.json); profiling again" in loaded.message


def test_a_hit_makes_its_job_the_most_recent_one(tmp_path: Path) -> None:
    first, second = JobCache(tmp_path, _job()), JobCache(tmp_path, _job(num_microbatches=4))
    first.store(_artefacts())
    second.store(_artefacts())
    assert first.load().hit
    assert json.loads((tmp_path / "last_job.json").read_text())["fingerprint"] == first.fingerprint
    assert not JobCache(tmp_path, _job(num_microbatches=2)).load().hit
    assert json.loads((tmp_path / "last_job.json").read_text())["fingerprint"] == first.fingerprint, (
        "a miss leaves the record to the job that stores"
    )


def test_a_miss_names_only_what_changed_not_tuples_read_back_as_lists(tmp_path: Path) -> None:
    spec = {"sm_clocks_mhz": (1980, 1500)}
    JobCache(tmp_path, _planned("iso-time", spec)).store(_artefacts())
    miss = JobCache(tmp_path, _planned("iso-time", spec, num_microbatches=4)).load()
    assert not miss.hit and "num_microbatches: 8 -> 4" in miss.message
    assert "sm_clocks_mhz" not in miss.message


def test_a_plan_of_another_schema_version_is_a_miss_that_says_so_in_one_line(tmp_path: Path) -> None:
    """An old cache is not migrated: its job profiles again, and the store of that run replaces it."""
    old_plan = json.dumps({"schema_version": 2, "target": "iso-time", "points": []})
    JobCache(tmp_path, _job()).store(_artefacts() | {"plan.json": old_plan})
    loaded = JobCache(tmp_path, _job()).load()
    assert not loaded.hit and loaded.quarantined is None and not loaded.artefacts
    assert loaded.message == (
        f"energy cache at {loaded.folder} holds a schema-version-2 plan, which this megatron_energy does not "
        "read (it writes version 3): profiling again"
    )
    JobCache(tmp_path, _job()).store(_artefacts())
    assert JobCache(tmp_path, _job()).load().hit


def test_a_runs_own_files_beside_the_cache_are_never_taken_for_a_broken_store(tmp_path: Path) -> None:
    """A power trace (or partial profile) left by a run cut short made the next run quarantine it."""
    folder = tmp_path / "job"
    folder.mkdir()
    beside = [JobFiles(folder).power_trace(0, "csv"), JobFiles(folder).partial_profile(1)]
    for path in beside:
        path.write_text("time_s\n")
    assert not has_cached_files(folder)
    (folder / "plan.json").write_text("{")  # a store's file, without its manifest: moved aside
    quarantined = quarantine(folder)
    assert [p.name for p in quarantined.iterdir()] == ["plan.json"]
    assert all(path.exists() for path in beside)
