"""GDN ReplaySSM: checkpoint + ring of SSM inputs for Gated-DeltaNet decode and spec verify."""

__all__: list[str] = []
