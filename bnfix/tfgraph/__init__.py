"""TF graph front-end: GraphDef / MetaGraph / SavedModel analysis (update ops, train op reachability)."""
