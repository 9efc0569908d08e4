"""Stage selections for tests that run the pipeline."""

from flows.orchestrate.pipeline import select_stages


def without_profile(stop: str = "evaluate") -> list[str]:
    """The stages up to `stop` without `profile`: its pictures (word clouds, charts: seconds per
    run) are read by the tests of the profile, and no stage needs them."""
    return [s for s in select_stages(stop=stop) if s != "profile"]
