"""History compaction: planning (budget, plan), serialization, deterministic parts (extract),
injection, the summarizer calls, and the engine that ties them to the store."""
