"""Lesson 15 (from laptop to cluster): the answer key (adopted from the lesson's own checks). No code exercise."""
from __future__ import annotations

from dtlab.course.exercises.model import MEASURED, Mistake, Prediction

PREDICTIONS = (
    # 15.link_order is timed: on a quiet machine TP, DP, PP, but on a loaded one TP's and DP's added
    # times come close enough to swap, so only the run can say (the answer key fills in the measurement).
    Prediction("15.same_losses", 15, "the same losses, bit for bit", "损失逐位相同", answer=True,
               hint_en="True or False", hint_zh="True 或 False",
               mistakes=(Mistake(False, "the same seed, batches and reduction order on the same kind of ranks: "
                                 "where the processes run does not change the arithmetic",
                                 "相同的种子、批次和归约顺序：进程在哪里运行不会改变运算"),)),
    Prediction("15.link_order", 15, "layouts by the time the link adds to a step, most first",
               "按链路给每步增加的时间排序的布局（最多的在前）", answer=MEASURED,
               hint_en='a list of "tp", "dp", "pp"', hint_zh='"tp"、"dp"、"pp" 的列表',
               mistakes=(Mistake(["dp", "tp", "pp"], "DP sends the most bytes in one all-reduce, but TP's 16 small "
                                 "all-reduces each block the computation", "DP 一次全归约的字节最多，但 TP 的 16 次小全归约每次都会阻塞计算"),)),
    Prediction("15.mib", 15, "MiB over each node's link, each way", "每个节点链路每个方向的 MiB",
               answer={"flat": 6.0, "hierarchical": 4.0}, hint_en='{"flat": MiB, "hierarchical": MiB}',
               hint_zh='{"flat": MiB, "hierarchical": MiB}',
               why_en="flat: 2(P-1)/P of the tensor; hierarchical: 2(N-1)/N", why_zh="扁平：张量的 2(P-1)/P；分层：2(N-1)/N"),
    Prediction("15.hier_faster", 15, "hierarchical faster than the flat ring", "分层比扁平环更快", answer=True,
               hint_en="True or False", hint_zh="True 或 False"),
)

EXERCISES = ()
