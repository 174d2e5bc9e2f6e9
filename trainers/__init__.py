"""hf_specdec.trainers: data preparation, collators and Trainer subclasses."""
