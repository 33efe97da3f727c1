"""Selective GraphRAG: an entity graph built only where relations are dense.

* :mod:`graph.entities` — entity mentions by pattern (identifiers, options, macros, variables,
  names, table headers), normalised so that aliases meet;
* :mod:`graph.build` — :class:`GraphIndex`: degrees counted within each collection, only dense
  entities (degree > ``threshold``, default 5) and their relations materialised, relations
  labelled by spaCy's dependency parse of those units only; kept in step with the index by
  document, persisted beside it (checksummed, atomic);
* :mod:`graph.walk` — the query path: link the question's entities, walk 1-2 hops, search a
  multi-part question's parts, fuse with the ranking (:class:`GraphPath`).

Never imports grpc: the gateway and ``GraphService.Expand`` call it.
"""
