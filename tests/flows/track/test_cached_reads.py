"""What a fully cached run reads of its splits to track and register them: nothing, once a run has
described and hashed the same files (on a large corpus these reads were the part of a cached run
that grew with it)."""

import pandas as pd
import pytest

from flows.plan.store import StageStore
from flows.track import champion
from flows.track.datasets import dataset_entity
from tasks.util.io import Rows, file_sha256


@pytest.fixture
def split(tmp_path):
    path = tmp_path / "test.parquet"
    pd.DataFrame(
        {"id": [3, 1, 2], "text": ["好", "差", "一般"], "label": ["1", "0", "1"]}
    ).to_parquet(path)
    return path


def test_a_test_split_is_hashed_once_per_file_content(split, tmp_path):
    kept = StageStore(tmp_path / "store")
    recorded = file_sha256(split)
    first = champion.kept_test_sha256(Rows(split), recorded, kept)
    assert first == champion.test_sha256(Rows(split))
    # the file is not read again: gone, its recorded hash still answers
    split.unlink()
    assert champion.kept_test_sha256(Rows(split), recorded, kept) == first
    # another file's content is another record: hashed, and here unreadable
    with pytest.raises(FileNotFoundError):
        champion.kept_test_sha256(Rows(split), "0" * 64, kept)


def test_a_split_described_before_is_not_read_again(split, monkeypatch, tmp_path):
    from flows.plan import project

    monkeypatch.setattr(project, "current", lambda: project.Project(tmp_path))
    reads = []

    def head():
        reads.append(1)
        return pd.read_parquet(split)

    first = dataset_entity(head, str(split), "p-test", rows=3)
    again = dataset_entity(head, str(split), "p-test", rows=3)
    assert reads == [1] and first.digest == again.digest and first.schema == again.schema
