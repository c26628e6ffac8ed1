"""What is not the model but reads it: interventions (what-if runs) and measures (loss, logit lens, KL, head sweep)."""
