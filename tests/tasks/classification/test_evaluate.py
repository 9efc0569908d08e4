import numpy as np
import pytest
from PIL import Image

from tasks.classification.evaluate import plot_confusion, score
from tasks.shared.reports import comparison_markdown


def test_score_and_confusion(tmp_path):
    y_true = np.array([0, 0, 1, 1, 2, 2])
    y_pred = np.array([0, 1, 1, 1, 2, 0])
    metrics, per_class, matrix = score(y_true, y_pred, ["差", "中", "好"])
    assert metrics["test_accuracy"] == 4 / 6
    assert per_class["recall"].tolist() == [0.5, 1.0, 0.5]
    assert matrix.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    plot_confusion(matrix, ["a", "b", "c"], "t", tmp_path / "cm.png")
    assert Image.open(tmp_path / "cm.png").size[0] > 200


def test_markdown_table():
    import pandas as pd

    md = comparison_markdown(pd.DataFrame([{"model": "textcnn", "test_accuracy": 0.9}]))
    assert md.splitlines() == ["| model | test_accuracy |", "|---|---|", "| textcnn | 0.9000 |"]


def test_chinese_labels_never_drawn_as_boxes():
    from tasks.classification.evaluate import tick_labels
    from tasks.util.plots import cjk_font

    shown, note = tick_labels(["好评", "差评"])
    if cjk_font():
        assert shown == ["好评", "差评"] and note == ""
    else:
        assert shown == ["0", "1"] and "no CJK font" in note
    assert tick_labels(["pos", "neg"]) == (["pos", "neg"], "")


def test_metric_names_carry_the_label_not_its_index():
    from tasks.classification.evaluate import metric_name

    assert (
        metric_name("好评") == "好评" and metric_name("a:b?") == "a_b_" and metric_name("") == "_"
    )


def test_worst_mistakes_read_from_the_split_file_in_batches_equal_those_of_the_frame(
    tmp_path, monkeypatch
):
    import numpy as np
    import pandas as pd

    import tasks.util.io as io
    from tasks.classification.evaluate import worst_mistakes
    from tasks.util.io import Rows

    rng = np.random.default_rng(0)
    test = pd.DataFrame({"id": range(500, 900), "text": [f"第{i}条" for i in range(400)]})
    test.to_parquet(tmp_path / "test.parquet", row_group_size=9)
    y = rng.integers(3, size=400)
    probs = rng.dirichlet(np.ones(3), size=400).astype(np.float32)
    monkeypatch.setattr(io, "BATCH_ROWS", 25)
    whole = worst_mistakes(test, y, probs, ["a", "b", "c"], k=30)
    streamed = worst_mistakes(Rows(tmp_path / "test.parquet"), y, probs, ["a", "b", "c"], k=30)
    assert len(whole) == 30 and whole["confidence"].is_monotonic_decreasing
    pd.testing.assert_frame_equal(streamed.reset_index(drop=True), whole.reset_index(drop=True))


def test_selection_takes_the_cheaper_model_inside_the_noise_of_the_validation_split():
    """fastText ahead of tfidf_lr by 9 of 745 validation rows (1.2 points), the two disagreeing on
    75 rows: the lead is inside the noise of the paired difference, so the cheaper tfidf_lr is
    chosen and says why. A lead beyond the noise keeps the better model; `select: best` keeps the
    old rule; ties go to the cheaper model."""
    import pandas as pd

    from tasks.classification.evaluate import choose, paired_gap, right_rows

    rows = 745
    both = 620
    fasttext = np.zeros(rows, bool)
    tfidf = np.zeros(rows, bool)
    fasttext[:both], tfidf[:both] = True, True
    fasttext[both : both + 42] = True  # right where tfidf_lr is wrong
    # and the other way round: 75 rows of disagreement, 9 net
    tfidf[both + 42 : both + 42 + 33] = True
    gap, se = paired_gap(fasttext, tfidf)
    assert gap == pytest.approx(9 / rows) and se == pytest.approx(
        np.sqrt(75 - rows * gap**2) / rows
    )
    table = pd.DataFrame(
        {
            "model": ["fasttext", "tfidf_lr", "textcnn"],
            "val_accuracy": [fasttext.mean(), tfidf.mean(), 0.80],
        }
    )
    right = {"fasttext": fasttext, "tfidf_lr": tfidf, "textcnn": np.arange(rows) % 5 != 0}
    chosen, why = choose(table, "accuracy", right, "simplest")
    assert chosen == "tfidf_lr" and "inside the noise" in why and "fasttext" in why
    assert choose(table, "accuracy", right, "best")[0] == "fasttext"
    # nothing to compare row by row
    assert choose(table, "accuracy", {**right, "fasttext": None}, "simplest")[0] == "fasttext"
    clear = np.zeros(rows, bool)
    clear[: both + 60] = True  # right on every row tfidf_lr is, and on 60 more
    tfidf_only = np.zeros(rows, bool)
    tfidf_only[:both] = True
    table = pd.DataFrame(
        {"model": ["textcnn", "tfidf_lr"], "val_accuracy": [clear.mean(), tfidf_only.mean()]}
    )
    assert (
        choose(table, "accuracy", {"textcnn": clear, "tfidf_lr": tfidf_only}, "simplest")[0]
        == "textcnn"
    )
    twins = pd.DataFrame({"model": ["bert", "textcnn"], "val_accuracy": [0.9, 0.9]})
    assert (
        choose(twins, "accuracy", {"bert": fasttext, "textcnn": fasttext}, "simplest")[0]
        == "textcnn"
    )
    import base64

    packed = base64.b64encode(np.packbits(fasttext).tobytes()).decode()
    assert (
        right_rows({"validation_right": packed, "validation_rows": rows}) == fasttext
    ).all() and right_rows({}) is None
