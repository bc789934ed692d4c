"""Speculative decoding (docs/runtime.md, "Speculative decoding"): n-gram drafts
(`ngram.NgramProposer`), their verification against the target model's tokens (`verify`)."""
