"""What a run hands to people and deployments: training curves, model card, Triton repository, package."""
