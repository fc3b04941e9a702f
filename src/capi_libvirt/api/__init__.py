"""The provider's API: typed models of its custom resources, the single source of truth for the generated CRDs."""
