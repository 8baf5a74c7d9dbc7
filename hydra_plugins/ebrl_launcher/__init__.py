"""ebrl's Hydra plugins (Hydra loads launchers only from the ``hydra_plugins`` namespace)."""
