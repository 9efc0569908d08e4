"""Chunk planning over Parquet row groups: every row once, in order; small groups read together,
large ones sliced."""

import pandas as pd

from tasks.util.io import chunk_plan, read_chunk, write_parquet


def test_plan_merges_small_row_groups_and_slices_large_ones(tmp_path):
    small, large = tmp_path / "small.parquet", tmp_path / "large.parquet"
    df = pd.DataFrame({"id": range(105), "text": [f"第{i}条" for i in range(105)]})
    write_parquet(df, small, row_group_rows=10)  # 11 groups: 10 x 10 rows + 5
    write_parquet(df, large, row_group_rows=60)  # 2 groups: 60 + 45
    merged = chunk_plan(small, 25)
    # the last three: 25 rows
    assert [c.row_groups for c in merged] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9, 10)]
    sliced = chunk_plan(large, 25)
    assert [(c.row_groups, c.start, c.stop) for c in sliced] == [
        ((0,), 0, 25),
        ((0,), 25, 50),
        ((0,), 50, 60),
        ((1,), 0, 25),
        ((1,), 25, 45),
    ]
    for chunks in (merged, sliced):
        back = pd.concat([read_chunk(c) for c in chunks], ignore_index=True)
        pd.testing.assert_frame_equal(back, df)
