"""What a resumed run may change, per config field (`field(metadata=...)`) or per group (a class's RESUME); anything
else would change the training numbers and is refused by `checkpoint.strict_resume` (`hacrl.driver.resume`)."""

SAFE = {"resume": "safe"}
"""Never changes the training numbers (evaluation, logging, scoring limits, where workers run)."""
NOT_EXACT = {"resume": "not_exact"}
"""Allowed, to move a run or to fit memory, at the price of bit-exactness (float sums, batching and the sampler's
random draws then differ from an uninterrupted run)."""
