"""What ``ebrl.train`` keeps apart from its loop: where a run resumes (:mod:`.resume`), the
arithmetic of its metrics (:mod:`.metrics`), the evaluation of its weights (:mod:`.evaluation`)
and what it reports and writes (:mod:`.report`)."""
