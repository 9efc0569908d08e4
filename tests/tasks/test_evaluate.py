import numpy as np
from PIL import Image

from tasks.evaluate import comparison_markdown, plot_confusion, score


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
    from tasks.evaluate import tick_labels
    from tasks.plots import cjk_font

    shown, note = tick_labels(["好评", "差评"])
    if cjk_font():
        assert shown == ["好评", "差评"] and note == ""
    else:
        assert shown == ["0", "1"] and "no CJK font" in note
    assert tick_labels(["pos", "neg"]) == (["pos", "neg"], "")


def test_metric_names_carry_the_label_not_its_index():
    from tasks.evaluate import metric_name

    assert metric_name("好评") == "好评" and metric_name("a:b?") == "a_b_" and metric_name("") == "_"
