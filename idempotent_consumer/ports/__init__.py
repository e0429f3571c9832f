"""The small interfaces the protocol needs, all async: the document store, the message sender, and what one
delivery attempt reached of them (``watched``)."""
