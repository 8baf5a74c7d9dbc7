"""Supervised fine-tuning before RL: a scripted LIBERO-Object expert, its demonstrations, behaviour
cloning of ebrl's own policies, and the checkpoint PPO starts from (``init_checkpoint=<file>``).

``python -m ebrl.sft.libero`` runs the pipeline (``expert``, ``collect``, ``clone``, ``eval``).
"""
