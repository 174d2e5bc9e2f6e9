"""``hf-specdec corpus``: the training corpora written once to disk (``command.py``). Without ``--regenerate`` it
tokenizes ShareGPT into a pre-tokenized corpus (``data/tokenized.py``); with it, the target answers ShareGPT's prompts
itself (``regenerate.py``, batched, or with a refilled batch: ``refill.py``), after a filter that keeps every bench
prompt out (``bench_overlap.py``), writing resumable shards (``store.py``) that are assembled into a ``datasets``
dataset and the same pre-tokenized corpus (``dataset.py``); ``measure.py`` times the methods and batch sizes."""
