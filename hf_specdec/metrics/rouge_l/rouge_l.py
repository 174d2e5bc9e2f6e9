"""ROUGE-L F1 (Lin, 2004) of each prediction against its reference, with ``rouge_score`` (no stemming, its default
tokenizer), averaged over examples: the ``rougeL`` of the Hub's ``rouge`` module with ``use_aggregator=False``, then
the mean. An ``evaluate`` metric module shipped with hf_specdec (``hf_specdec.metrics.load_metric("rouge_l")``)."""

import datasets
import evaluate
from rouge_score import rouge_scorer


class RougeL(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Lin, C.-Y. (2004). ROUGE: A Package for Automatic Evaluation of Summaries.",
            inputs_description="predictions: list of str; references: list of str (one per prediction)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references):
        scorer = rouge_scorer.RougeScorer(["rougeL"])
        scores = [scorer.score(ref, pred)["rougeL"].fmeasure for pred, ref in zip(predictions, references)]
        return {"rougeL": sum(scores) / len(scores) if scores else 0.0, "per_example": scores}
