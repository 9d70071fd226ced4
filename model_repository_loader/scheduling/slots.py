"""Free sequence slots, handed out in exactly the order Triton's sequence batcher hands them out.

Triton keeps free (instance, slot) pairs in a `std::priority_queue` ordered only by slot
index, so which instance wins a tie follows libstdc++'s heap algorithm. Emulating that heap
reproduces Triton's placement: with two instances the first two sequences land on different
instances and the third joins the second one's [V].
"""

from __future__ import annotations

Slot = tuple[int, int]  # (instance index, slot index)


def _before(a: Slot, b: Slot) -> bool:
    # The comparator of the priority queue: true when `a` ranks below `b` (higher slot index).
    return a[1] > b[1]


class FreeSlots:
    def __init__(self, instances: int, slots_per_instance: int) -> None:
        self._heap: list[Slot] = []
        for index in range(instances):
            for slot in range(slots_per_instance):
                self.push((index, slot))

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: Slot) -> None:
        """std::push_heap."""
        heap = self._heap
        heap.append(item)
        hole = len(heap) - 1
        self._sift_up(hole, 0, item)

    def pop(self) -> Slot:
        """std::pop_heap (libstdc++'s __adjust_heap), then remove the back."""
        heap = self._heap
        top = heap[0]
        last = heap.pop()
        if heap:
            self._adjust(last)
        return top

    def _sift_up(self, hole: int, top: int, value: Slot) -> None:
        heap = self._heap
        parent = (hole - 1) // 2
        while hole > top and _before(heap[parent], value):
            heap[hole] = heap[parent]
            hole = parent
            parent = (hole - 1) // 2
        heap[hole] = value

    def _adjust(self, value: Slot) -> None:
        heap = self._heap
        length = len(heap)
        hole = child = 0
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if _before(heap[child], heap[child - 1]):
                child -= 1
            heap[hole] = heap[child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            heap[hole] = heap[child - 1]
            hole = child - 1
        self._sift_up(hole, 0, value)
