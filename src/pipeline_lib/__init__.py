"""loopline: looped-transformer pretraining pipeline library."""
