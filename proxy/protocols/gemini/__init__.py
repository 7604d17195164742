"""Google's Gemini API (generateContent, streamGenerateContent, countTokens) as a protocol of the
proxy (design.md § Gemini API): its adapter onto the neutral model, body checks, errors in
Google's shape, windows, stream checks, usage and the route."""
