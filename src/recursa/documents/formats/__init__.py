"""One module per family of formats; each turns a Source into Pieces (recursa.documents.build)."""
