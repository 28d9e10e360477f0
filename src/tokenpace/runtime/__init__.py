"""The engine-agnostic step loop: policy plans, engine runs, the result feeds back."""
