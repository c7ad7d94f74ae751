//! A least-recently-used map bounded by a byte budget (the embedder's cache
//! of compiled shapes).

/// One cached value and its bookkeeping.
struct Entry<K, V> {
    key: K,
    value: V,
    bytes: usize,
    /// The use counter when this entry was last used.
    used: u64,
}

/// A least-recently-used map whose entries each cost some bytes. Inserting
/// evicts the least recently used entries until the total fits the budget;
/// the entry just inserted is always kept, even when it alone is over the
/// budget (the caller is about to use it). Few entries are expected (one per
/// compiled shape), so lookups scan.
pub(crate) struct ByteLru<K, V> {
    budget: usize,
    clock: u64,
    entries: Vec<Entry<K, V>>,
}

impl<K: PartialEq + Clone, V> ByteLru<K, V> {
    /// An empty cache holding at most `budget` bytes (beyond its newest entry).
    pub(crate) fn new(budget: usize) -> Self {
        ByteLru {
            budget,
            clock: 0,
            entries: Vec::new(),
        }
    }

    /// Whether `key` is cached (does not count as a use).
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.entries.iter().any(|e| e.key == *key)
    }

    /// The value for `key`, marked as the most recently used.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.clock += 1;
        let clock = self.clock;
        let e = self.entries.iter_mut().find(|e| e.key == *key)?;
        e.used = clock;
        Some(&mut e.value)
    }

    /// The most recently used value (not counted as a use).
    pub(crate) fn most_recent_mut(&mut self) -> Option<&mut V> {
        self.entries
            .iter_mut()
            .max_by_key(|e| e.used)
            .map(|e| &mut e.value)
    }

    /// Insert (or replace) `key`, costing `bytes`, as the most recently used
    /// entry, then evict least recently used others until the total is within
    /// the budget. Returns the evicted keys, oldest first.
    pub(crate) fn insert(&mut self, key: K, value: V, bytes: usize) -> Vec<K> {
        self.entries.retain(|e| e.key != key);
        self.clock += 1;
        self.entries.push(Entry {
            key,
            value,
            bytes,
            used: self.clock,
        });
        let mut evicted = Vec::new();
        while self.total_bytes() > self.budget && self.entries.len() > 1 {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
                .expect("more than one entry");
            evicted.push(self.entries.remove(oldest).key);
        }
        evicted
    }

    /// Sum of the entries' bytes.
    pub(crate) fn total_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The keys, least recently used first.
    pub(crate) fn keys(&self) -> Vec<K> {
        let mut v: Vec<(u64, K)> = self
            .entries
            .iter()
            .map(|e| (e.used, e.key.clone()))
            .collect();
        v.sort_by_key(|(u, _)| *u);
        v.into_iter().map(|(_, k)| k).collect()
    }

    /// The byte budget.
    pub(crate) fn budget(&self) -> usize {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::ByteLru;

    #[test]
    fn evicts_least_recently_used_to_fit_the_budget() {
        let mut c: ByteLru<u32, &str> = ByteLru::new(100);
        assert!(c.insert(1, "a", 40).is_empty());
        assert!(c.insert(2, "b", 40).is_empty());
        assert_eq!(c.total_bytes(), 80);
        // Using 1 makes 2 the oldest: a third entry of 40 evicts 2 only.
        assert_eq!(c.get_mut(&1), Some(&mut "a"));
        assert_eq!(c.insert(3, "c", 40), vec![2]);
        assert_eq!(c.keys(), vec![1, 3]);
        assert_eq!(c.total_bytes(), 80);
        assert!(!c.contains(&2));
        // 70 more bytes: both older entries go, oldest first.
        assert_eq!(c.insert(4, "d", 70), vec![1, 3]);
        assert_eq!(c.keys(), vec![4]);
        assert_eq!(c.total_bytes(), 70);
    }

    #[test]
    fn keeps_the_newest_entry_even_over_budget() {
        let mut c: ByteLru<u32, u32> = ByteLru::new(10);
        c.insert(1, 1, 5);
        assert_eq!(c.insert(2, 2, 50), vec![1]);
        assert_eq!(c.len(), 1);
        assert_eq!(c.total_bytes(), 50);
        assert_eq!(c.most_recent_mut(), Some(&mut 2));
        // Replacing a key does not count it twice.
        assert!(c.insert(2, 3, 8).is_empty());
        assert_eq!(c.total_bytes(), 8);
        assert_eq!(c.get_mut(&2), Some(&mut 3));
        // A zero budget keeps exactly the newest entry.
        let mut z: ByteLru<u32, u32> = ByteLru::new(0);
        z.insert(1, 1, 1);
        assert_eq!(z.insert(2, 2, 1), vec![1]);
        assert_eq!(z.keys(), vec![2]);
    }
}
