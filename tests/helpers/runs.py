"""Stage selections for tests of the data stages."""
from flows.orchestrate.pipeline import select_stages


def data_stages(stop: str) -> list[str]:
    """The stages up to `stop` without `profile`: its pictures (word clouds, charts: seconds per run) are read by the
    tests of the profile, not by those of the chunked, partitioned or remote data stages, and no stage needs them."""
    return [s for s in select_stages(stop=stop) if s != "profile"]
