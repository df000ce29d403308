"""Write the key tables of ``docs/reference/job-yaml.md`` from the job YAML's schema (``job_file.py``).

Run from the repository root after changing the schema: ``python scripts/job_yaml_reference.py``;
``tests/test_job_file.py`` fails while the page is not current.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package

from megatron_energy.job_file import job_yaml_page  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "job-yaml.md"

if __name__ == "__main__":
    PAGE.write_text(job_yaml_page(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"{PAGE} written")
