"""Shared test fixtures.

- ``shared_data``: the real data sets in ../shared/data. Absent on a user's fresh clone, so tests
  that need it skip with a reason; CI sets REQUIRE_SHARED_DATA=1, which turns that skip into a failure.
- ``tiny_llama``: a tiny random Llama with a tiny tokenizer saved as a HF directory (session-scoped).
- ``tool_model_dir``: a tiny Llama that has memorised CoT / PoT / TIR answers (tests/tool_model.py; session-scoped).
- ``other_user``: a second, non-root local user and an interpreter it can run (tests/other_user.py), for what holds
  for an ordinary user; created where the suite runs as root (CI), skip with the reason otherwise.
- ``browser``: Debian's chromium + chromedriver and selenium, for tests marked ``browser`` (the report page);
  skip when absent, and CI sets REQUIRE_BROWSER=1, which turns that skip into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))


def pytest_configure(config: pytest.Config) -> None:
    """What every project command does first (flows/_common.py ``begin``): Prefect's state in the project's
    ``.prefect/`` (never ``~/.prefect``), set before any test module imports Prefect; DeepSpeed told it runs on the
    CPU when no GPU is visible."""
    from flows._common import begin

    begin(None)


@pytest.fixture(scope="session")
def other_user():
    """A second, non-root local user (tests/other_user.py): created where the suite runs as root; skip otherwise."""
    from tests.other_user import cleanup, other_user

    user, why = other_user()
    if user is None:
        pytest.skip(why)
    yield user
    cleanup(user)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data (or $SHARED_DATA); skip, or fail under REQUIRE_SHARED_DATA=1, when absent."""
    if not (SHARED_DATA / "README.md").is_file():
        msg = f"real data not found at {SHARED_DATA} (set SHARED_DATA or clone beside ../shared)"
        if os.environ.get("REQUIRE_SHARED_DATA") == "1":
            pytest.fail(msg + "; REQUIRE_SHARED_DATA=1 makes this a failure")
        pytest.skip(msg)
    return SHARED_DATA


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose greedy answers are memorised CoT / PoT / TIR solutions (tests/tool_model.py)."""
    from tests.tool_model import make_tool_model_dir

    return make_tool_model_dir(tmp_path_factory.mktemp("tool_model") / "model")


@pytest.fixture(scope="session")
def browser() -> tuple[str, str]:
    """(chromium, chromedriver) paths; skip, or fail under REQUIRE_BROWSER=1, when they or selenium are absent."""
    from stages.report.browser import find_browser

    found = find_browser()
    try:
        import selenium  # noqa: F401
    except ImportError:
        found, why = None, "selenium not installed (pip install -e '.[dev]')"
    else:
        why = "chromium / chromedriver not found (bash .ci/setup installs them: apt-get install chromium chromium-driver)"
    if found is None:
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(why + "; REQUIRE_BROWSER=1 makes this a failure")
        pytest.skip(why)
    return found


@pytest.fixture(scope="session")
def prefect_api():
    """One Prefect test server (temporary SQLite DB) for the whole test session.

    Its URL is also exported as PREFECT_API_URL, so flows run in subprocesses (``python -m flows.x``,
    ``dvc repro``) report to it instead of each starting a temporary server of their own.
    """
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        old = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = url
        try:
            yield url
        finally:
            if old is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = old
