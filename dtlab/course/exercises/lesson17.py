"""Lesson 17 (glossary): the answer key. The lesson has no code exercise; it shows the learner's progress."""

from __future__ import annotations

from dtlab.course.exercises.model import Mistake, Prediction

PREDICTIONS = (
    Prediction(
        "17.pipeline_zh",
        17,
        "Chinese for pipeline parallelism",
        "“pipeline parallelism”的中文",
        answer="流水线并行",
        hint_en="Chinese characters",
        hint_zh="中文",
        mistakes=(
            Mistake(
                "管道并行",
                "the glossary's term is 流水线并行 (an assembly line), the word used in the Chinese literature",
                "术语表用的是“流水线并行”，这是中文文献中的说法",
            ),
        ),
    ),
    Prediction(
        "17.zero_abbr",
        17,
        "'零冗余优化器' finds ZeRO",
        "用“零冗余优化器”能查到 ZeRO",
        answer="ZeRO",
        hint_en="an abbreviation",
        hint_zh="一个缩写",
    ),
)

EXERCISES = ()
