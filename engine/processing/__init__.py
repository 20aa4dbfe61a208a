"""Requests in and tokens out: validation and tokenizing (``input_processor``), sampling
(``sampler``, ``beam_search``), stop checks and outputs (``output_processor``, ``detokenizer``)."""
