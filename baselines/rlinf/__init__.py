"""Real RLinf (the optional ``rlinf`` extra): config translation and launch wrappers."""
