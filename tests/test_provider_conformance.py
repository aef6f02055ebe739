"""The conformance suite (recursa.testing.conformance, the kit a `recursa-<provider>` plugin
runs) over every registered provider that takes a base_url: recursa's own and any installed
plugin's. The cases, the fake wires and how a client is built are the kit's
(docs/providers.md); tests/test_provider_kit.py runs it over the docs' example adapter."""

from __future__ import annotations

from recursa.testing.conformance import ProviderConformance, hosted_prefixes


class TestEveryProvider(ProviderConformance):
    prefixes = hosted_prefixes(slow={"litellm"})    # LiteLLM takes ~5 s to import
