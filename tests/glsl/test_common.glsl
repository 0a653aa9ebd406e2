// Included by saxpy.comp: the runtime tests check that an edit here changes the cache key.
float axpby(float a, float x, float b, float y) { return a * x + b * y; }
