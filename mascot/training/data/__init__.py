"""Training data: candidate replies, sibling blocks of Director decisions, preference pairs."""
