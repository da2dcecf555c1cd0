"""A pretrained source's tensors in a LoopedLM (torch): the import (:mod:`.hf_import`) and
``retrofit-plan`` (:mod:`.layer_similarity`, :mod:`.plan`, :mod:`.report`)."""
