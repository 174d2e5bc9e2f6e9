"""The data every training run reads: ShareGPT conversations rendered in the target's chat template with only the
assistant's answers supervised (``chat.py``: SFT samples, packed blocks, whole conversations), the same conversations
pre-tokenized once into a compact corpus folder and read back (``tokenized.py``), and the training and validation rows
a drafter run builds from either (``rows.py``: packed blocks or whole conversations, several corpora mixed)."""
