"""Looking inside attention: head statistics, map images and the step-by-step explanation of one head.
Torch and Pillow only (never Lightning or wandb), so `generate.py` and the training callbacks share it."""
