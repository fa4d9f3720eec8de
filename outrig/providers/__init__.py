"""Renting GPU boxes through a provider's API: the interface (:mod:`.base`), the registry of
providers (:mod:`.registry`), one module per provider (:mod:`.sandbox`), the journal's record
of what was rented (:mod:`.ledger`), the money limits (:mod:`.budget`), the rent and release
flows (:mod:`.renting`) and the spare that ``watch --spare auto`` rents (:mod:`.spares`).
docs/providers.md is the user's page.
"""
