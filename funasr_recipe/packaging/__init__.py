"""What a run hands to deployments: the package, its model card, the Triton repository and ensemble."""
